"""A wire-faithful fake Kubernetes API server for tests (aiohttp, HTTP/1.1 on 127.0.0.1).

No real kube-apiserver can run on the build machines (see the project notes), so the adapter's
real code and its real client library (kubernetes_asyncio) are driven against this server. The
rule for extending it: it must *refuse* whatever a real API server refuses (stale
resourceVersions, double binding, strategic-merge-patch on custom resources, json-patch with an
object body, too-old watch resourceVersions), otherwise tests pass and production fails.

Implemented: discovery, one global monotonically increasing resourceVersion, CRUD with
generateName / AlreadyExists / optimistic concurrency, merge / strategic / json patch with
content-type checks, the status subresource, finalizers, list + watch (replay from an event log,
410 Expired after compaction, bookmarks, timeoutSeconds, label and field selectors with
enter/leave transitions), pods/binding, pods/eviction (429 through a test hook), Events and
coordination.k8s.io/v1 Leases (a PUT carrying a stale resourceVersion is a 409 Conflict, as for
every object). ``request_hook`` lets a test delay or stall requests; ``responses`` records every
answer's status.
Not implemented: authn/authz, admission/defaulting, schema validation, server-side apply,
pagination (limit/continue are ignored), watch-list streaming, PDB arithmetic, protobuf, HTTP/2.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

JSON = "application/json"
Obj = dict[str, Any]


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    builtin: bool = True
    has_status: bool = True
    verbs: tuple[str, ...] = ("create", "delete", "get", "list", "patch", "update", "watch")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.group, self.version, self.plural)


BUILTIN_TYPES = [
    ResourceType("", "v1", "nodes", "Node", namespaced=False),
    ResourceType("", "v1", "pods", "Pod", namespaced=True),
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False),
    ResourceType("", "v1", "events", "Event", namespaced=True, has_status=False),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True, has_status=False),
    ResourceType(
        "scheduling.k8s.io",
        "v1",
        "priorityclasses",
        "PriorityClass",
        namespaced=False,
        has_status=False,
    ),
]
CRD_TYPES = [
    ResourceType(
        "scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup", namespaced=True, builtin=False
    ),
    ResourceType(
        "scheduling.volcano.sh", "v1beta1", "queues", "Queue", namespaced=False, builtin=False
    ),
    ResourceType(
        "scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup", namespaced=True, builtin=False
    ),
    ResourceType(
        "scheduling.run.ai", "v2alpha2", "podgroups", "PodGroup", namespaced=True, builtin=False
    ),
    ResourceType("scheduling.run.ai", "v2", "queues", "Queue", namespaced=False, builtin=False),
]


class ApiError(Exception):
    """Answered as a metav1.Status body."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}


def status_body(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    body: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def success_body() -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def json_response(body: Any, status: int = 200) -> web.Response:
    # Exactly "application/json", no charset: some clients compare the header literally.
    return web.Response(
        body=json.dumps(body).encode(), status=status, headers={"Content-Type": JSON}
    )


# ------------------------------------------------------------------------------------------
# Selectors
# ------------------------------------------------------------------------------------------

_SET_REQ = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def parse_label_selector(text: str) -> Callable[[dict[str, str]], bool]:
    reqs: list[Callable[[dict[str, str]], bool]] = []
    for part in _split_selector(text or ""):
        m = _SET_REQ.match(part)
        if m:
            key, op, vals = (
                m.group(1),
                m.group(2),
                {v.strip() for v in m.group(3).split(",") if v.strip()},
            )
            if op == "in":
                reqs.append(lambda lb, k=key, vs=vals: lb.get(k) in vs)
            else:
                reqs.append(lambda lb, k=key, vs=vals: lb.get(k) not in vs)
        elif "!=" in part:
            key, val = (s.strip() for s in part.split("!=", 1))
            reqs.append(lambda lb, k=key, v=val: lb.get(k) != v)
        elif "==" in part or "=" in part:
            key, val = (s.strip() for s in re.split("==|=", part, maxsplit=1))
            reqs.append(lambda lb, k=key, v=val: lb.get(k) == v)
        elif part.startswith("!"):
            absent = part[1:].strip()
            reqs.append(lambda lb, k=absent: k not in lb)
        elif re.match(r"^[A-Za-z0-9./_-]+$", part):
            reqs.append(lambda lb, k=part: k in lb)
        else:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
    return lambda labels: all(r(labels) for r in reqs)


def _field_value(obj: Obj, path: str) -> str:
    cur: Any = obj
    for step in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(step)
    return "" if cur is None else str(cur)


def parse_field_selector(text: str) -> Callable[[Obj], bool]:
    reqs: list[Callable[[Obj], bool]] = []
    for part in _split_selector(text or ""):
        if "!=" in part:
            path, val = (s.strip() for s in part.split("!=", 1))
            reqs.append(lambda o, p=path, v=val: _field_value(o, p) != v)
        elif "=" in part:
            path, val = (s.strip() for s in re.split("==|=", part, maxsplit=1))
            reqs.append(lambda o, p=path, v=val: _field_value(o, p) == v)
        else:
            raise ApiError(400, "BadRequest", f"invalid field selector: {part!r}")
    return lambda obj: all(r(obj) for r in reqs)


# ------------------------------------------------------------------------------------------
# Patches
# ------------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"invalid json-patch path {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: Obj, ops: list[Obj]) -> Obj:
    """RFC 6902 JSON patch: add, remove, replace, test."""
    doc = copy.deepcopy(doc)
    for op in ops:
        kind, steps = op.get("op"), _pointer(str(op.get("path", "")))
        parent: Any = doc
        for step in steps[:-1]:
            parent = parent[int(step)] if isinstance(parent, list) else parent.get(step)
            if parent is None:
                raise ApiError(422, "Invalid", f"json-patch path {op.get('path')!r} does not exist")
        last = steps[-1]
        if kind == "test":
            cur = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if cur != op.get("value"):
                raise ApiError(422, "Invalid", f"json-patch test failed at {op.get('path')!r}")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op.get("value"))
                elif kind == "add":
                    parent.insert(int(last), op.get("value"))
                else:
                    parent[int(last)] = op.get("value")
            else:
                if kind == "replace" and last not in parent:
                    raise ApiError(
                        422, "Invalid", f"json-patch replace of missing {op.get('path')!r}"
                    )
                parent[last] = op.get("value")
        elif kind == "remove":
            try:
                del parent[int(last) if isinstance(parent, list) else last]
            except (KeyError, IndexError):
                raise ApiError(
                    422, "Invalid", f"json-patch remove of missing {op.get('path')!r}"
                ) from None
        else:
            raise ApiError(422, "Invalid", f"unsupported json-patch op {kind!r}")
    return doc


# ------------------------------------------------------------------------------------------
# Watches
# ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class LoggedEvent:
    rv: int
    rtype: tuple[str, str, str]
    kind: str  # ADDED | MODIFIED | DELETED
    old: Obj | None
    new: Obj


@dataclass(slots=True, eq=False)
class Watcher:
    rtype: ResourceType
    namespace: str | None
    label_match: Callable[[dict[str, str]], bool]
    field_match: Callable[[Obj], bool]
    queue: asyncio.Queue[Obj | None] = field(default_factory=asyncio.Queue)

    def selects(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata", {})
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self.label_match(meta.get("labels") or {}) and self.field_match(obj)

    def translate(self, ev: LoggedEvent) -> Obj | None:
        """The event this watcher sees, with selector transitions (leave -> DELETED, enter -> ADDED)."""
        if ev.rtype != self.rtype.key:
            return None
        was, now = self.selects(ev.old), self.selects(ev.new)
        if ev.kind == "DELETED":
            return {"type": "DELETED", "object": ev.new} if was or now else None
        if was and now:
            return {"type": ev.kind, "object": ev.new}
        if now:
            return {"type": "ADDED", "object": ev.new}
        if was:
            return {"type": "DELETED", "object": ev.new}
        return None


# ------------------------------------------------------------------------------------------
# The server
# ------------------------------------------------------------------------------------------


class FakeApiServer:
    def __init__(self, *, bookmark_interval: float = 0.2, event_log_size: int = 100_000) -> None:
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        for rt in BUILTIN_TYPES + CRD_TYPES:
            self.register_type(rt)
        self.objects: dict[tuple[tuple[str, str, str], str, str], Obj] = {}
        self.rv = 0
        self.log: list[LoggedEvent] = []
        self.compacted_rv = 0  # watches from an RV below this get 410 Expired
        self.event_log_size = event_log_size
        self.watchers: set[Watcher] = set()
        self.bookmark_interval = bookmark_interval
        self.requests: list[tuple[str, str]] = []
        self.responses: list[tuple[str, str, int]] = []  # (method, path, HTTP status)
        # Awaited before each request is handled: a test delays or stalls requests with it.
        self.request_hook: Callable[[str, str], Awaitable[None]] | None = None
        self.eviction_hook: Callable[[Obj], bool] | None = None  # True: refuse with 429
        self.fail_next: dict[
            tuple[str, str], int
        ] = {}  # (method, path regex) -> status to answer once
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -------------------------------------------------------------- lifecycle

    async def start(self) -> str:
        app = web.Application(client_max_size=8 * 2**20)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def register_type(self, rt: ResourceType) -> None:
        self.types[rt.key] = rt

    def register_crd(
        self, group: str, version: str, plural: str, kind: str, namespaced: bool = True
    ) -> None:
        self.register_type(ResourceType(group, version, plural, kind, namespaced, builtin=False))

    # -------------------------------------------------------------- test controls

    def compact(self) -> None:
        """Forget the event log: watches from any earlier RV now get 410 Expired."""
        self.compacted_rv = self.rv
        self.log.clear()

    def drop_watches(self) -> None:
        """Close every open watch stream (an apiserver restart or a load-balancer cut)."""
        for w in list(self.watchers):
            w.queue.put_nowait(None)
        self.watchers.clear()

    def run_on_server(self, fn: Callable[[FakeApiServer], Any]) -> Any:
        """Run several store changes as one atomic step (nothing else runs in between)."""
        return fn(self)

    def set_eviction_hook(self, hook: Callable[[Obj], bool] | None) -> None:
        self.eviction_hook = hook

    def _rtype(self, api_version: str, kind: str) -> ResourceType:
        for rt in self.types.values():
            if rt.api_version == api_version and rt.kind == kind:
                return rt
        raise KeyError(f"{api_version} {kind} is not served")

    def put_object(self, obj: Obj) -> Obj:
        """Create or replace an object as a controller would (kubelet, another scheduler, a user).

        Writes status as well (it plays every writer). Returns the stored copy.
        """
        rt = self._rtype(obj["apiVersion"], obj["kind"])
        meta = obj.setdefault("metadata", {})
        ns = meta.get("namespace", "default") if rt.namespaced else ""
        if rt.namespaced:
            meta["namespace"] = ns
        key = (rt.key, ns, meta["name"])
        old = self.objects.get(key)
        new = copy.deepcopy(obj)
        if old is None:
            self._init_meta(new)
            return self._commit(rt, key, None, new, "ADDED")
        new["metadata"] = {**old["metadata"], **new["metadata"]}
        return self._commit(rt, key, old, new, "MODIFIED")

    def get_object(self, api_version: str, kind: str, name: str, namespace: str = "") -> Obj | None:
        rt = self._rtype(api_version, kind)
        obj = self.objects.get((rt.key, namespace if rt.namespaced else "", name))
        return copy.deepcopy(obj) if obj is not None else None

    def list_objects(self, api_version: str, kind: str, namespace: str | None = None) -> list[Obj]:
        rt = self._rtype(api_version, kind)
        return [
            copy.deepcopy(o)
            for (k, ns, _), o in self.objects.items()
            if k == rt.key and (namespace is None or ns == namespace)
        ]

    def delete_object(self, api_version: str, kind: str, name: str, namespace: str = "") -> None:
        rt = self._rtype(api_version, kind)
        key = (rt.key, namespace if rt.namespaced else "", name)
        if key in self.objects:
            self._remove(rt, key)

    # -------------------------------------------------------------- store

    def _init_meta(self, obj: Obj) -> None:
        meta = obj["metadata"]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta["generation"] = 1

    def _next_rv(self) -> int:
        self.rv += 1
        return self.rv

    def _commit(self, rt: ResourceType, key: Any, old: Obj | None, new: Obj, kind: str) -> Obj:
        rv = self._next_rv()
        new.setdefault("apiVersion", rt.api_version)
        new.setdefault("kind", rt.kind)
        new["metadata"]["resourceVersion"] = str(rv)
        self.objects[key] = new
        self._publish(LoggedEvent(rv, rt.key, kind, old, copy.deepcopy(new)))
        return copy.deepcopy(new)

    def _remove(self, rt: ResourceType, key: Any) -> Obj:
        old = self.objects.pop(key)
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(self._next_rv())  # DELETED carries its own RV
        self._publish(LoggedEvent(self.rv, rt.key, "DELETED", old, gone))
        return gone

    def _publish(self, ev: LoggedEvent) -> None:
        self.log.append(ev)
        if len(self.log) > self.event_log_size:
            drop = len(self.log) - self.event_log_size
            self.compacted_rv = self.log[drop - 1].rv
            del self.log[:drop]
        for w in self.watchers:
            out = w.translate(ev)
            if out is not None:
                w.queue.put_nowait(out)

    # -------------------------------------------------------------- HTTP

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        self.requests.append((request.method, path))
        if self.request_hook is not None:
            await self.request_hook(request.method, path)
        response = await self._answer(request, path)
        self.responses.append((request.method, path, response.status))
        return response

    async def _answer(self, request: web.Request, path: str) -> web.StreamResponse:
        try:
            for (method, pattern), code in list(self.fail_next.items()):
                if method == request.method and re.fullmatch(pattern, path):
                    del self.fail_next[(method, pattern)]
                    raise ApiError(
                        code, "InternalError" if code >= 500 else "BadRequest", "injected failure"
                    )
            return await self._route(request, path)
        except ApiError as err:
            return json_response(
                status_body(err.code, err.reason, err.message, err.details), err.code
            )

    async def _route(self, request: web.Request, path: str) -> web.StreamResponse:
        if path == "/version":
            return json_response(
                {
                    "major": "1",
                    "minor": "31",
                    "gitVersion": "v1.31.0-muster-fake",
                    "platform": "linux/amd64",
                }
            )
        if path == "/api":
            return json_response(
                {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
            )
        if path == "/apis":
            return json_response(self._api_groups())
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({path})"
            )
        if not rest:
            return json_response(self._resource_list(group, version))
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        plural = rest[0]
        rt = self.types.get((group, version, plural))
        if rt is None:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({path})"
            )
        if namespace is not None and not rt.namespaced:
            raise ApiError(404, "NotFound", f"{plural} is not namespaced")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if len(rest) > 3:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({path})"
            )
        if rt.namespaced and name is not None and namespace is None:
            raise ApiError(
                404, "NotFound", f"{plural} is namespaced; use /namespaces/<ns>/{plural}/{name}"
            )
        return await self._handle(request, rt, namespace, name, sub)

    def _api_groups(self) -> Obj:
        groups: dict[str, list[str]] = {}
        for rt in self.types.values():
            if rt.group:
                groups.setdefault(rt.group, [])
                if rt.version not in groups[rt.group]:
                    groups[rt.group].append(rt.version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                    "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                }
                for g, vs in groups.items()
            ],
        }

    def _resource_list(self, group: str, version: str) -> Obj:
        resources = []
        for rt in self.types.values():
            if rt.group != group or rt.version != version:
                continue
            resources.append(
                {
                    "name": rt.plural,
                    "singularName": rt.kind.lower(),
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": list(rt.verbs),
                }
            )
            if rt.has_status:
                resources.append(
                    {
                        "name": f"{rt.plural}/status",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": rt.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if rt.key == ("", "v1", "pods"):
                resources.append(
                    {
                        "name": "pods/binding",
                        "singularName": "",
                        "namespaced": True,
                        "kind": "Binding",
                        "verbs": ["create"],
                    }
                )
                resources.append(
                    {
                        "name": "pods/eviction",
                        "singularName": "",
                        "namespaced": True,
                        "group": "policy",
                        "version": "v1",
                        "kind": "Eviction",
                        "verbs": ["create"],
                    }
                )
        if not resources:
            raise ApiError(
                404,
                "NotFound",
                f"the server could not find the requested resource ({group}/{version})",
            )
        gv = f"{group}/{version}" if group else version
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": resources,
        }

    async def _read_json(self, request: web.Request) -> Any:
        try:
            return json.loads(await request.read() or b"null")
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"invalid JSON body: {exc}") from None

    async def _handle(
        self,
        request: web.Request,
        rt: ResourceType,
        namespace: str | None,
        name: str | None,
        sub: str | None,
    ) -> web.StreamResponse:
        m = request.method
        q = request.query
        if name is None:
            if m == "GET":
                if _truthy(q.get("watch")):
                    return await self._watch(request, rt, namespace)
                return self._list(rt, namespace, q)
            if m == "POST":
                return self._create(rt, namespace, await self._read_json(request))
            raise ApiError(
                405, "MethodNotAllowed", f"{m} is not supported on the {rt.plural} collection"
            )
        ns = namespace or ""
        key = (rt.key, ns, name)
        if sub is None:
            if m == "GET":
                return json_response(self._get(rt, key, name))
            if m == "PUT":
                return json_response(
                    self._update(rt, key, name, await self._read_json(request), status=False)
                )
            if m == "PATCH":
                body = await self._patch(request, rt, key, name, status=False)
                return json_response(body)
            if m == "DELETE":
                return json_response(self._delete(rt, key, name))
        elif sub == "status" and rt.has_status:
            if m == "GET":
                return json_response(self._get(rt, key, name))
            if m == "PUT":
                return json_response(
                    self._update(rt, key, name, await self._read_json(request), status=True)
                )
            if m == "PATCH":
                return json_response(await self._patch(request, rt, key, name, status=True))
        elif sub == "binding" and rt.key == ("", "v1", "pods") and m == "POST":
            return self._bind(key, name, await self._read_json(request))
        elif sub == "eviction" and rt.key == ("", "v1", "pods") and m == "POST":
            return self._evict(key, name, await self._read_json(request))
        raise ApiError(405, "MethodNotAllowed", f"{m} on {rt.plural}/{sub or ''} is not supported")

    def _not_found(self, rt: ResourceType, name: str) -> ApiError:
        what = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
        return ApiError(
            404,
            "NotFound",
            f'{what} "{name}" not found',
            {"name": name, "group": rt.group, "kind": rt.plural},
        )

    def _get(self, rt: ResourceType, key: Any, name: str) -> Obj:
        obj = self.objects.get(key)
        if obj is None:
            raise self._not_found(rt, name)
        return obj

    def _list(self, rt: ResourceType, namespace: str | None, q: Any) -> web.Response:
        labels = parse_label_selector(q.get("labelSelector", ""))
        fields = parse_field_selector(q.get("fieldSelector", ""))
        probe = Watcher(rt, namespace, labels, fields)
        items = []
        for (k, _ns, _n), obj in self.objects.items():
            if k == rt.key and probe.selects(obj):
                item = copy.deepcopy(obj)
                if rt.builtin:  # built-in list items carry no kind/apiVersion on the wire
                    item.pop("kind", None)
                    item.pop("apiVersion", None)
                items.append(item)
        return json_response(
            {
                "kind": f"{rt.kind}List",
                "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }
        )

    def _create(self, rt: ResourceType, namespace: str | None, body: Any) -> web.Response:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of a create must be an object")
        meta = body.setdefault("metadata", {})
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and namespace and body_ns != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            meta["namespace"] = namespace or body_ns or "default"
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(
                    422, "Invalid", f"{rt.kind} is invalid: metadata.name: Required value"
                )
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if body.get("kind", rt.kind) != rt.kind:
            raise ApiError(400, "BadRequest", f"kind {body.get('kind')!r} does not match {rt.kind}")
        key = (rt.key, meta.get("namespace", "") if rt.namespaced else "", meta["name"])
        if key in self.objects:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{rt.plural} "{meta["name"]}" already exists',
                {"name": meta["name"], "kind": rt.plural},
            )
        meta.pop("resourceVersion", None)
        new = copy.deepcopy(body)
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        self._init_meta(new)
        meta_new = new["metadata"]
        meta_new["uid"] = str(uuid.uuid4())
        meta_new["creationTimestamp"] = _now()
        if rt.key == ("", "v1", "pods"):
            new.setdefault("status", {}).setdefault("phase", "Pending")
        return json_response(self._commit(rt, key, None, new, "ADDED"), 201)

    def _write(self, rt: ResourceType, key: Any, old: Obj, new: Obj, *, status: bool) -> Obj:
        """Apply a write to the main resource (status ignored) or to /status (only status)."""
        if status:
            merged = copy.deepcopy(old)
            merged["status"] = new.get("status", {})
        else:
            merged = copy.deepcopy(new)
            if rt.has_status:
                merged["status"] = copy.deepcopy(old.get("status", {}))
            for immutable in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp"):
                if immutable in old["metadata"]:
                    merged["metadata"][immutable] = old["metadata"][immutable]
            spec_changed = merged.get("spec") != old.get("spec")
            merged["metadata"]["generation"] = old["metadata"].get("generation", 1) + (
                1 if spec_changed else 0
            )
        if old["metadata"].get("deletionTimestamp") and not merged["metadata"].get("finalizers"):
            return self._remove(rt, key)
        return self._commit(rt, key, old, merged, "MODIFIED")

    def _update(self, rt: ResourceType, key: Any, name: str, body: Any, *, status: bool) -> Obj:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of an update must be an object")
        old = self._get(rt, key, name)
        body_rv = (body.get("metadata") or {}).get("resourceVersion")
        if body_rv and body_rv != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {rt.plural} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                {"name": name, "kind": rt.plural},
            )
        if (body.get("metadata") or {}).get("name", name) != name:
            raise ApiError(
                400, "BadRequest", "the name of the object does not match the name on the URL"
            )
        return self._write(rt, key, old, body, status=status)

    async def _patch(
        self, request: web.Request, rt: ResourceType, key: Any, name: str, *, status: bool
    ) -> Obj:
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        body = await self._read_json(request) if ctype != "application/apply-patch+yaml" else None
        old = self._get(rt, key, name)
        if ctype == "application/merge-patch+json":
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
            new = merge_patch(old, body)
        elif ctype == "application/strategic-merge-patch+json":
            if not rt.builtin:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: application/json-patch+json, application/merge-patch+json, "
                    f"application/apply-patch+yaml (strategic merge patch is not supported for "
                    f"{rt.plural}.{rt.group})",
                )
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "a strategic merge patch must be a JSON object")
            new = merge_patch(old, body)  # gap: real SMP merges keyed lists
        elif ctype == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(
                    400,
                    "BadRequest",
                    "json: cannot unmarshal object into Go value of type []handlers.jsonPatchOp",
                )
            new = json_patch(old, body)
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: "
                f"application/json-patch+json, application/merge-patch+json, "
                f"application/strategic-merge-patch+json (got {ctype!r})",
            )
        patch_rv = (
            (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
        )
        if patch_rv and patch_rv != old["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {rt.plural} "{name}": '
                "the object has been modified; please apply your changes to the latest version",
            )
        return self._write(rt, key, old, new, status=status)

    def _delete(self, rt: ResourceType, key: Any, name: str) -> Obj:
        old = self._get(rt, key, name)
        if old["metadata"].get("finalizers"):
            if old["metadata"].get("deletionTimestamp"):
                return old
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = _now()
            return self._commit(rt, key, old, new, "MODIFIED")
        return self._remove(rt, key)

    def _bind(self, key: Any, name: str, body: Any) -> web.Response:
        pods = self.types[("", "v1", "pods")]
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body of a binding must be an object")
        body_name = (body.get("metadata") or {}).get("name")
        if body_name and body_name != name:
            raise ApiError(400, "BadRequest", "name in URL does not match name in Binding object")
        target = body.get("target") or {}
        if not target.get("name"):
            raise ApiError(
                422, "Invalid", f'Binding.core "{name}" is invalid: target.name: Required value'
            )
        if target.get("kind", "Node") not in ("Node", ""):
            raise ApiError(
                422, "Invalid", f'Binding.core "{name}" is invalid: target.kind: must be Node'
            )
        pod = self.objects.get(key)
        if pod is None:
            raise self._not_found(pods, name)
        body_uid = (body.get("metadata") or {}).get("uid")
        if body_uid and body_uid != pod["metadata"].get("uid"):
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": '
                f"Precondition failed: UID in precondition: {body_uid}, "
                f"UID in object meta: {pod['metadata'].get('uid')}",
            )
        if pod["metadata"].get("deletionTimestamp"):
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": '
                f"pod {name} is being deleted, cannot be assigned to a host",
            )
        current = (pod.get("spec") or {}).get("nodeName")
        if current:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": '
                f'pod {name} is already assigned to node "{current}"',
                {"name": name, "kind": "pods/binding"},
            )
        new = copy.deepcopy(pod)
        new.setdefault("spec", {})["nodeName"] = target["name"]
        conds = [
            c
            for c in new.setdefault("status", {}).get("conditions", [])
            if c.get("type") != "PodScheduled"
        ]
        conds.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()})
        new["status"]["conditions"] = conds
        self._commit(pods, key, pod, new, "MODIFIED")
        return json_response(success_body(), 201)

    def _evict(self, key: Any, name: str, body: Any) -> web.Response:
        pods = self.types[("", "v1", "pods")]
        if not isinstance(body, dict) or body.get("kind", "Eviction") != "Eviction":
            raise ApiError(
                400, "BadRequest", "the body of an eviction must be a policy/v1 Eviction"
            )
        pod = self.objects.get(key)
        if pod is None:
            raise self._not_found(pods, name)
        if self.eviction_hook is not None and self.eviction_hook(copy.deepcopy(pod)):
            raise ApiError(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                {
                    "causes": [
                        {
                            "reason": "DisruptionBudget",
                            "message": "The disruption budget needs 1 healthy pods and has 1 currently",
                        }
                    ]
                },
            )
        self._delete(pods, key, name)
        return json_response(success_body(), 201)

    async def _watch(
        self, request: web.Request, rt: ResourceType, namespace: str | None
    ) -> web.StreamResponse:
        q = request.query
        labels = parse_label_selector(q.get("labelSelector", ""))
        fields = parse_field_selector(q.get("fieldSelector", ""))
        rv_text = q.get("resourceVersion", "")
        bookmarks = _truthy(q.get("allowWatchBookmarks"))
        timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
        try:
            since = int(rv_text) if rv_text else 0
        except ValueError:
            raise ApiError(400, "BadRequest", f"invalid resourceVersion {rv_text!r}") from None
        # Registration and replay happen in one synchronous step: no gap, no duplicate.
        w = Watcher(rt, namespace, labels, fields)
        expired = since != 0 and since < self.compacted_rv
        if not expired:
            if since == 0:
                for (k, _ns, _n), obj in list(self.objects.items()):
                    if k == rt.key and w.selects(obj):
                        w.queue.put_nowait({"type": "ADDED", "object": copy.deepcopy(obj)})
            else:
                for ev in self.log:
                    if ev.rv > since:
                        out = w.translate(ev)
                        if out is not None:
                            w.queue.put_nowait(out)
            self.watchers.add(w)
        resp = web.StreamResponse(status=200, headers={"Content-Type": JSON})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if expired:
            err = status_body(
                410, "Expired", f"too old resource version: {since} ({self.compacted_rv})"
            )
            await resp.write(json.dumps({"type": "ERROR", "object": err}).encode() + b"\n")
            await resp.write_eof()
            return resp
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        try:
            while True:
                wait = self.bookmark_interval if bookmarks else None
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    wait = min(wait, left) if wait is not None else left
                try:
                    item = await asyncio.wait_for(w.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and (deadline is None or loop.time() < deadline):
                        item = {
                            "type": "BOOKMARK",
                            "object": {
                                "kind": rt.kind,
                                "apiVersion": rt.api_version,
                                "metadata": {"resourceVersion": str(self.rv)},
                            },
                        }
                    else:
                        continue
                if item is None:
                    break
                await resp.write(json.dumps(item).encode() + b"\n")
        except ConnectionResetError:
            return resp  # the client went away
        finally:
            self.watchers.discard(w)
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp


def make_node(
    name: str,
    *,
    cpu: str = "4",
    memory: str = "16Gi",
    pods: str = "110",
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    ready: bool = True,
    unschedulable: bool = False,
    taints: list[Obj] | None = None,
) -> Obj:
    alloc = {"cpu": cpu, "memory": memory, "pods": pods}
    if gpus:
        alloc["nvidia.com/gpu"] = str(gpus)
    node: Obj = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {
            "allocatable": alloc,
            "capacity": dict(alloc),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
    return node


_pod_seq = itertools.count()


def make_pod(
    name: str,
    *,
    namespace: str = "default",
    cpu: str = "1",
    memory: str = "1Gi",
    scheduler: str = "muster",
    group: str | None = None,
    coscheduling_group: str | None = None,
    task_spec: str | None = None,
    node: str | None = None,
    phase: str = "Pending",
    labels: dict[str, str] | None = None,
    priority_class: str | None = None,
) -> Obj:
    annotations: dict[str, str] = {}
    pod_labels = dict(labels or {})
    if group:
        annotations["scheduling.k8s.io/group-name"] = group
    if task_spec:
        annotations["volcano.sh/task-spec"] = task_spec
    if coscheduling_group:
        pod_labels["scheduling.x-k8s.io/pod-group"] = coscheduling_group
    spec: Obj = {
        "schedulerName": scheduler,
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "resources": {"requests": {"cpu": cpu, "memory": memory}},
            }
        ],
    }
    if node:
        spec["nodeName"] = node
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": pod_labels,
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def _given(**fields: Any) -> Obj:
    """The fields that are set (neither None nor empty), for a spec that leaves the others out."""
    return {k: v for k, v in fields.items() if v}


def make_volcano_podgroup(
    name: str,
    *,
    namespace: str = "default",
    min_member: int = 1,
    queue: str = "default",
    min_resources: dict[str, str] | None = None,
    min_task_member: dict[str, int] | None = None,
    priority_class: str | None = None,
) -> Obj:
    spec: Obj = {
        "minMember": min_member,
        "queue": queue,
        **_given(
            minResources=min_resources,
            minTaskMember=min_task_member,
            priorityClassName=priority_class,
        ),
    }
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def make_kai_podgroup(
    name: str,
    *,
    namespace: str = "default",
    min_member: int = 1,
    queue: str = "",
    sub_groups: list[Obj] | None = None,
    priority_class: str | None = None,
    preemptibility: str | None = None,
    topology: Obj | None = None,
) -> Obj:
    """A KAI Scheduler PodGroup (``scheduling.run.ai/v2alpha2``); its pods carry the annotation
    ``pod-group-name: <name>``."""
    spec: Obj = {
        "minMember": min_member,
        **_given(
            queue=queue,
            subGroups=sub_groups,
            priorityClassName=priority_class,
            preemptibility=preemptibility,
            topologyConstraint=topology,
        ),
    }
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def make_kai_queue(
    name: str, *, parent: str = "", priority: int | None = None, resources: Obj | None = None
) -> Obj:
    """A KAI Scheduler Queue (``scheduling.run.ai/v2``, cluster scoped)."""
    spec: Obj = {
        "resources": resources
        if resources is not None
        else {r: {"quota": -1, "limit": -1, "overQuotaWeight": 1} for r in ("gpu", "cpu", "memory")}
    }
    if parent:
        spec["parentQueue"] = parent
    if priority is not None:
        spec["priority"] = priority
    return {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": name},
        "spec": spec,
    }


def make_kai_pod(
    name: str,
    *,
    group: str | None = None,
    queue: str | None = None,
    sub_group: str | None = None,
    annotations: dict[str, str] | None = None,
    **kwargs: Any,
) -> Obj:
    """A pod following KAI's conventions: annotation ``pod-group-name``, labels
    ``kai.scheduler/queue`` and ``kai.scheduler/subgroup-name``, plus any other annotations
    (``gpu-fraction``, ``gpu-memory``, ``kai.scheduler/topology*``)."""
    pod = make_pod(name, **kwargs)
    m = pod["metadata"]
    if group:
        m["annotations"]["pod-group-name"] = group
    if queue:
        m["labels"]["kai.scheduler/queue"] = queue
    if sub_group:
        m["labels"]["kai.scheduler/subgroup-name"] = sub_group
    m["annotations"].update(annotations or {})
    return pod
