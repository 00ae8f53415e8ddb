"""Leader election for the Kubernetes adapter: one ``coordination.k8s.io/v1`` Lease per backend.

Several adapter replicas may run (a Deployment of two, a rollout's surge pod, one started from a
workstation); only the Lease's holder runs :class:`~adapters.k8s.adapter.K8sBackend` (registers
with Muster, binds, evicts). The protocol is client-go's ``leaderelection`` with a Lease lock:

* **Every attempt is read, then write**: GET the Lease, decide, then PUT it back carrying the
  ``resourceVersion`` that was read. The API server refuses a PUT whose ``resourceVersion`` is
  stale with 409 Conflict, so of two candidates that read the same Lease only one can write it:
  a conflict means someone else won (or renewed) in between. A missing Lease is created; 409
  AlreadyExists likewise means someone else was first.
* **Expiry is measured on the candidate's own clock.** A candidate remembers when it first saw
  the Lease's current ``resourceVersion`` and takes the Lease over only once
  ``leaseDurationSeconds`` have passed since then with no change, never by comparing the
  holder's ``renewTime`` with its own wall clock (clocks of two nodes may disagree). A Lease
  without a holder (released) is free at once.
* **The leader gives up before anyone may take over.** It renews every ``renew_deadline / 2``
  seconds and, after a failed try, every ``retry_period`` seconds. Its leadership ends
  ``renew_deadline`` seconds after the *start* of its last successful renew, and
  ``renew_deadline < lease_duration``: a candidate saw that renew no earlier than it started, so
  the old leader has stopped at least ``lease_duration - renew_deadline`` seconds before the
  Lease can change hands. The leader's work runs in a cancel scope whose deadline is that
  moment (a hung API call cannot stretch it), and :meth:`LeaderElector.is_leader` turns false at
  the same instant, for writers to check right before a bind.
* **Seeing another holder ends leadership at once** (the Lease was taken or edited).
* **Release on a clean stop**: the holder clears ``holderIdentity`` and shortens
  ``leaseDurationSeconds`` to 1 after its work has stopped, so a standby takes over at its next
  try instead of waiting for the Lease to expire. A killed process releases nothing; its Lease
  then expires as above.

Lease bodies are sent and read as plain JSON (``_preload_content=False``): the generated models
would write a ``MicroTime`` without fractional seconds whenever they happen to be zero, which a
real API server refuses.
"""

from __future__ import annotations

import json
import math
import os
import random
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import anyio
import structlog
from kubernetes_asyncio import client

log = structlog.get_logger("muster.k8s.lease")

Obj = dict[str, Any]

LEASE_API_VERSION = "coordination.k8s.io/v1"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def default_lease_name(backend_name: str) -> str:
    return f"muster-k8s-adapter-{backend_name}"


# Outside a cluster: the namespace of the shipped manifests, so an adapter started by hand
# contends for the deployed adapters' Lease instead of taking one of its own and binding too.
OUTSIDE_NAMESPACE = "muster-system"


def default_namespace(sa_file: str = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """``$POD_NAMESPACE`` (the downward API), else the pod's service account namespace, else
    ``muster-system`` (outside a cluster)."""
    env = os.environ.get("POD_NAMESPACE", "").strip()
    if env:
        return env
    try:
        with open(sa_file) as f:
            return f.read().strip() or OUTSIDE_NAMESPACE
    except OSError:
        return OUTSIDE_NAMESPACE


def default_identity() -> str:
    """The pod's name (``$POD_NAME``, else the host name) plus a random suffix: two processes in
    one pod, or a restarted container, are never taken for the same holder."""
    base = os.environ.get("POD_NAME", "").strip() or socket.gethostname()
    return f"{base}_{secrets.token_hex(4)}"


def _micro_time(when: datetime) -> str:
    # metav1.MicroTime is RFC 3339 with exactly six fractional digits; the API server refuses less.
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    name: str
    namespace: str
    identity: str
    lease_duration: float = 15.0  # how long a Lease holds without a renew
    renew_deadline: float = 10.0  # how long the leader keeps trying to renew before it stops
    retry_period: float = 2.0  # between tries: candidates, and a leader whose renew failed

    def __post_init__(self) -> None:
        if not self.name or not self.namespace or not self.identity:
            raise ValueError("a lease needs a name, a namespace and a holder identity")
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration "
                f"(got {self.retry_period}, {self.renew_deadline}, {self.lease_duration})"
            )

    @property
    def renew_interval(self) -> float:
        """How often a leader renews: room for retries before the renew deadline."""
        return self.renew_deadline / 2

    @property
    def duration_seconds(self) -> int:
        # leaseDurationSeconds is a whole number; rounding up never shortens the holder's promise.
        return max(1, math.ceil(self.lease_duration))


@dataclass(frozen=True, slots=True)
class Reply:
    status: int  # HTTP status; 0 when the request itself failed
    body: Obj | None = None
    message: str = ""


class LeaseApi:
    """GET / POST / PUT of one namespaced Lease, bodies as JSON dicts."""

    def __init__(self, api: client.ApiClient) -> None:
        self.coordination = client.CoordinationV1Api(api)

    async def _call(self, coro: Awaitable[Any]) -> Reply:
        try:
            resp = await coro
        except Exception as exc:  # noqa: BLE001 - connection refused, reset, DNS: a failed try
            return Reply(0, None, f"{type(exc).__name__}: {exc}")
        try:
            raw = await resp.read()
        finally:
            resp.release()
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            data = None
        body = data if isinstance(data, dict) else None
        if 200 <= resp.status < 300:
            return Reply(resp.status, body)
        message = str((body or {}).get("message") or raw[:200].decode(errors="replace"))
        return Reply(resp.status, body, message)

    async def get(self, namespace: str, name: str) -> Reply:
        return await self._call(
            self.coordination.read_namespaced_lease(name, namespace, _preload_content=False)
        )

    # The stubs ask for a V1Lease; the client serializes a dict body as it is (module docstring).
    async def create(self, namespace: str, body: Obj) -> Reply:
        lease: Any = body
        return await self._call(
            self.coordination.create_namespaced_lease(namespace, lease, _preload_content=False)
        )

    async def replace(self, namespace: str, name: str, body: Obj) -> Reply:
        lease: Any = body
        return await self._call(
            self.coordination.replace_namespaced_lease(
                name, namespace, lease, _preload_content=False
            )
        )


class Attempt(Enum):
    HELD = "held"  # we hold the Lease (acquired or renewed)
    TAKEN = "taken"  # another holder has it and it has not expired
    FAILED = "failed"  # conflict, API error, or no answer: try again later


class LeaderElector:
    """Campaigns for a Lease and runs ``lead()`` while holding it; see the module docstring.

    ``await elector.run(lead)`` loops: campaign, lead (``lead()`` runs until it returns, or until
    leadership is lost, then it is cancelled), campaign again after a loss. It returns after
    :meth:`stop` or when ``lead()`` returned by itself, in both cases releasing the Lease once the
    work has stopped. An exception from ``lead()`` also releases the Lease, then propagates.
    Cancelling ``run`` from outside releases nothing (as if the process were killed).
    """

    def __init__(self, api: client.ApiClient, config: LeaseConfig) -> None:
        self.config = config
        self.leases = LeaseApi(api)
        self.holder = ""  # the holder last seen on the Lease ("" when none)
        self.terms = 0  # how often this elector has become the leader
        self._observed_rv = ""
        self._observed_at = -math.inf
        self._leading = False
        self._deadline = -math.inf  # the moment leadership ends unless renewed (anyio clock)
        self._work_scope: anyio.CancelScope | None = None
        self._stop = anyio.Event()
        self._rng = random.Random()

    @property
    def identity(self) -> str:
        return self.config.identity

    def is_leader(self) -> bool:
        """Whether this elector holds the Lease *now*: false from the renew deadline on, even
        before the renew loop has noticed. Writers check it right before a bind."""
        return self._leading and anyio.current_time() < self._deadline

    def stop(self) -> None:
        """Stop at once: cancel the leader's work, release the Lease, make :meth:`run` return."""
        self._stop.set()
        if self._work_scope is not None:
            self._work_scope.cancel()

    # ------------------------------------------------------------------ the loop

    async def run(self, lead: Callable[[], Awaitable[None]]) -> None:
        while await self._campaign():
            if not await self._lead(lead):
                return

    async def _campaign(self) -> bool:
        """Try until the Lease is ours (True) or :meth:`stop` (False)."""
        log.info(
            "leader election: campaigning",
            identity=self.identity,
            lease=f"{self.config.namespace}/{self.config.name}",
        )
        while not self._stop.is_set():
            start = anyio.current_time()
            result = Attempt.FAILED
            with anyio.move_on_after(self.config.renew_deadline):  # a hung request is a failure
                result = await self._try()
            if result is Attempt.HELD and self._stop.is_set():
                await self._release()  # stopped while acquiring: never lead, hand it back
                return False
            if result is Attempt.HELD:
                self._leading = True
                self._deadline = start + self.config.renew_deadline
                self.terms += 1
                log.info(
                    "leader election: acquired",
                    identity=self.identity,
                    lease=f"{self.config.namespace}/{self.config.name}",
                    term=self.terms,
                )
                return True
            # client-go's jitter: candidates that failed together do not retry in step
            with anyio.move_on_after(self.config.retry_period * self._rng.uniform(1.0, 1.2)):
                await self._stop.wait()
        return False

    async def _lead(self, lead: Callable[[], Awaitable[None]]) -> bool:
        """Run ``lead()`` while renewing. True: leadership was lost (campaign again); False: the
        work ended or we were stopped (the Lease has been released)."""
        ended = anyio.Event()
        finished = False

        async def work() -> None:
            nonlocal finished
            try:
                # The deadline cancels the work the instant leadership may have lapsed, whatever
                # the renew loop is doing; each successful renew moves it on.
                with anyio.CancelScope(deadline=self._deadline) as scope:
                    self._work_scope = scope
                    if self._stop.is_set():
                        scope.cancel()
                    await lead()
                    finished = True
            finally:
                self._work_scope = None
                ended.set()

        lost = ""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(work)
                lost = await self._renew_until_lost(ended)
                tg.cancel_scope.cancel()
        except Exception:
            self._leading = False
            await self._release()  # the work crashed: hand over now, then let the error out
            raise
        finally:
            self._leading = False
        if lost and not finished and not self._stop.is_set():
            log.warning(
                "leader election: lost", identity=self.identity, holder=self.holder, reason=lost
            )
            return True
        # The work has stopped (the task group is done): only now may anyone else bind.
        await self._release()
        return False

    async def _renew_until_lost(self, ended: anyio.Event) -> str:
        """Renew until leadership is lost (the reason) or the work ended / stop ("")."""
        # Counted from the start of the acquiring attempt, like the deadline.
        next_try = self._deadline - self.config.renew_deadline + self.config.renew_interval
        while True:
            wait = min(next_try, self._deadline) - anyio.current_time()
            with anyio.move_on_after(max(0.0, wait)):
                await ended.wait()  # stop() cancels the work, so it ends too
            if ended.is_set() and not self._past_deadline():
                return ""
            if self._past_deadline():
                return "renew deadline passed"
            if anyio.current_time() < next_try:
                continue
            start = anyio.current_time()
            result = Attempt.FAILED
            with anyio.move_on_after(self._deadline - start):
                result = await self._try()
            if result is Attempt.HELD:
                self._deadline = start + self.config.renew_deadline
                if self._work_scope is not None:
                    self._work_scope.deadline = self._deadline
                next_try = start + self.config.renew_interval
            elif result is Attempt.TAKEN:
                self._deadline = -math.inf
                if self._work_scope is not None:
                    self._work_scope.cancel()
                return f"the lease is held by {self.holder}"
            else:
                next_try = anyio.current_time() + self.config.retry_period

    def _past_deadline(self) -> bool:
        return anyio.current_time() >= self._deadline

    # ------------------------------------------------------------------ one try

    def _observe(self, lease: Obj) -> tuple[str, float]:
        """Record what the Lease says now; returns its holder and duration."""
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        duration = float(spec.get("leaseDurationSeconds") or self.config.lease_duration)
        rv = str((lease.get("metadata") or {}).get("resourceVersion") or "")
        if rv != self._observed_rv:
            self._observed_rv = rv
            self._observed_at = anyio.current_time()
        if holder != self.holder:
            log.info(
                "leader election: new holder observed",
                identity=self.identity,
                holder=holder or None,
                previous=self.holder or None,
            )
            self.holder = holder
        return holder, duration

    def _spec(self, old: Obj, *, now: datetime) -> Obj:
        holder = str(old.get("holderIdentity") or "")
        spec = dict(old)
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = self.config.duration_seconds
        spec["renewTime"] = _micro_time(now)
        if holder != self.identity:
            spec["acquireTime"] = _micro_time(now)
            spec["leaseTransitions"] = int(old.get("leaseTransitions") or 0) + 1
        return spec

    async def _try(self) -> Attempt:
        """One read-then-write attempt to acquire or renew the Lease."""
        ns, name = self.config.namespace, self.config.name
        got = await self.leases.get(ns, name)
        now = datetime.now(UTC)
        if got.status == 404:
            spec = self._spec({}, now=now)
            spec["leaseTransitions"] = 0
            body: Obj = {
                "apiVersion": LEASE_API_VERSION,
                "kind": "Lease",
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "labels": {"app.kubernetes.io/part-of": "muster"},
                },
                "spec": spec,
            }
            made = await self.leases.create(ns, body)
            if made.status == 201 and made.body is not None:
                self._observe(made.body)
                return Attempt.HELD
            log.info("leader election: create failed", status=made.status, message=made.message)
            return Attempt.FAILED
        if got.status != 200 or got.body is None:
            log.warning(
                "leader election: cannot read the lease", status=got.status, message=got.message
            )
            return Attempt.FAILED
        lease = got.body
        holder, duration = self._observe(lease)
        if (
            holder
            and holder != self.identity
            and (self._leading or self._observed_at + duration > anyio.current_time())
        ):
            return Attempt.TAKEN
        body = dict(lease)  # keeps metadata.resourceVersion: the write is refused if it is stale
        body["spec"] = self._spec(lease.get("spec") or {}, now=now)
        put = await self.leases.replace(ns, name, body)
        if put.status == 200 and put.body is not None:
            self._observe(put.body)
            return Attempt.HELD
        if put.status == 409:
            log.info("leader election: conflict, someone else wrote the lease first")
        else:
            log.warning("leader election: update failed", status=put.status, message=put.message)
        return Attempt.FAILED

    async def _release(self) -> None:
        """Clear the holder and shorten the Lease, if it is still ours (bounded, shielded)."""
        ns, name = self.config.namespace, self.config.name
        with anyio.move_on_after(max(self.config.retry_period, 1.0), shield=True):
            got = await self.leases.get(ns, name)
            if got.status != 200 or got.body is None:
                return
            spec = dict(got.body.get("spec") or {})
            if spec.get("holderIdentity") != self.identity:
                return
            spec.pop("holderIdentity", None)
            spec["leaseDurationSeconds"] = 1
            spec["renewTime"] = _micro_time(datetime.now(UTC))
            body = dict(got.body)
            body["spec"] = spec
            put = await self.leases.replace(ns, name, body)
            if put.status == 200:
                self.holder = ""
                log.info("leader election: released", identity=self.identity)
            else:
                log.warning(
                    "leader election: release failed", status=put.status, message=put.message
                )
