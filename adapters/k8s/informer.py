"""A list + watch informer over kubernetes_asyncio, on raw JSON dicts.

Loop: list (remember the list's resourceVersion) -> watch from that RV with bookmarks -> when the
stream ends (server timeout, dropped connection) watch again from the last RV seen (events and
bookmarks both advance it) -> on 410 Expired the RV is too old: re-list and *diff* against the
cache, so a deletion that happened while we were not watching is still reported.

The watch is opened with ``timeoutSeconds`` so kubernetes_asyncio never reconnects on its own
(it would retry a 410 with the same RV once, and hide stream ends): every reconnect is ours,
visible in ``resumes`` / ``relists``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import anyio
import structlog
from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException

from adapters.k8s.translate import key_of
from adapters.retry import Backoff

log = structlog.get_logger("muster.k8s.informer")

Obj = dict[str, Any]
# handler(event_type, new_object, old_object_or_None); event_type ADDED | MODIFIED | DELETED.
Handler = Callable[[str, Obj, Obj | None], None]
ListFn = Callable[..., Awaitable[Any]]


class Informer:
    def __init__(
        self,
        name: str,
        list_fn: ListFn,
        *args: Any,
        handler: Handler,
        label_selector: str = "",
        field_selector: str = "",
        watch_timeout: int = 300,
        backoff_initial: float = 0.2,
        backoff_max: float = 10.0,
        missing_retry: float = 30.0,
    ) -> None:
        self.name = name
        self._list_fn = list_fn
        self._args = args
        self._handler = handler
        self._selectors: dict[str, str] = {}
        if label_selector:
            self._selectors["label_selector"] = label_selector
        if field_selector:
            self._selectors["field_selector"] = field_selector
        self.watch_timeout = watch_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.missing_retry = missing_retry
        self.cache: dict[str, Obj] = {}
        self.resource_version = ""
        self.synced = anyio.Event()
        self.served = True  # False while the API server does not serve the resource (CRD absent)
        # Counters, for tests and logs.
        self.lists = 0
        self.relists = 0  # lists after a 410
        self.resumes = 0  # watches reopened from a known RV
        self.events = 0

    async def run(self) -> None:
        # Full jitter in [cap/2, cap]; reset once a watch ran to its end.
        backoff = Backoff(
            initial=self.backoff_initial, factor=2.0, max=self.backoff_max, jitter=0.5
        )
        while True:
            try:
                if not self.resource_version:
                    await self._list()
                await self._watch()
                backoff.reset()
                self.resumes += 1
            except ApiException as exc:
                if exc.status == 410:
                    log.info(
                        "watch expired, re-listing", informer=self.name, rv=self.resource_version
                    )
                    self.resource_version = ""
                    self.relists += 1
                    continue
                if exc.status == 404:
                    await self._not_served()
                    continue
                await self._retry_later(backoff, f"HTTP {exc.status} {exc.reason}")
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                await self._retry_later(backoff, repr(exc))

    async def _retry_later(self, backoff: Backoff, error: str) -> None:
        delay = backoff.next()
        log.info("informer error, retrying", informer=self.name, error=error, delay=round(delay, 3))
        await anyio.sleep(delay)

    async def _not_served(self) -> None:
        if self.served:
            log.warning(
                "resource not served by the API server (CRD not installed?)", informer=self.name
            )
        self.served = False
        self._replace({})
        self.resource_version = ""
        self.synced.set()
        await anyio.sleep(self.missing_retry)

    async def _list(self) -> None:
        resp = await self._list_fn(*self._args, _preload_content=False, **self._selectors)
        try:
            body = await resp.read()
            if resp.status != 200:
                raise ApiException(status=resp.status, reason=body.decode(errors="replace")[:200])
        finally:
            resp.release()
        data = json.loads(body)
        self.lists += 1
        self.served = True
        self._replace({key_of(item): item for item in data.get("items") or []})
        self.resource_version = str((data.get("metadata") or {}).get("resourceVersion") or "")
        self.synced.set()

    def _replace(self, fresh: dict[str, Obj]) -> None:
        """Swap the cache for a fresh list, reporting the difference as events."""
        old = self.cache
        self.cache = fresh
        for key, obj in fresh.items():
            before = old.get(key)
            if before is None:
                self._emit("ADDED", obj, None)
            elif (before.get("metadata") or {}).get("resourceVersion") != (
                obj.get("metadata") or {}
            ).get("resourceVersion"):
                self._emit("MODIFIED", obj, before)
        for key, obj in old.items():
            if key not in fresh:
                self._emit("DELETED", obj, obj)

    async def _watch(self) -> None:
        w = watch.Watch(return_type="object")  # raw dicts: no model deserialization
        stream = w.stream(
            self._list_fn,
            *self._args,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout,
            _request_timeout=self.watch_timeout + 30,
            **self._selectors,
        )
        try:
            async for event in stream:
                kind, obj = event["type"], event["raw_object"]
                if kind == "BOOKMARK":
                    self.resource_version = w.resource_version or self.resource_version
                    continue
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    self.resource_version = str(rv)
                self._apply(kind, obj)
        finally:
            await w.close()

    def _apply(self, kind: str, obj: Obj) -> None:
        key = key_of(obj)
        before = self.cache.get(key)
        if kind == "DELETED":
            self.cache.pop(key, None)
            self._emit("DELETED", obj, before)
        elif kind in ("ADDED", "MODIFIED"):
            self.cache[key] = obj
            self._emit("ADDED" if before is None else "MODIFIED", obj, before)

    def _emit(self, kind: str, obj: Obj, before: Obj | None) -> None:
        self.events += 1
        try:
            self._handler(kind, obj, before)
        except Exception:  # a handler bug must not stop the informer
            log.exception("informer handler failed", informer=self.name, kind=kind, key=key_of(obj))
