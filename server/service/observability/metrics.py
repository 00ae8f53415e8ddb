"""Prometheus metrics of a Muster server (series documented in docs/observability.md).

Two kinds of series:

* *event* series, updated as things happen: cycle and per-action / per-plugin latency
  histograms (Volcano's names and buckets), decisions issued / settled and their ack latency,
  API requests by method and code;
* *state* series, computed from the cluster state when ``/metrics`` is scraped (jobs and tasks
  by phase and queue, unschedulable jobs and tasks, queue allocated / deserved / capability,
  backends): nothing is maintained between scrapes, and the scrape runs on the event loop
  (the aiohttp handler), so it reads a consistent state.

Every server has its own ``CollectorRegistry``: several servers in one process do not mix.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, Histogram
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from muster.conditions import UNSCHEDULABLE
from muster.jsonmap import short_enum_name
from muster.quantity import CPU, MEMORY
from muster.v1 import muster_pb2 as pb
from server.model import ALLOCATED_OR_UNKNOWN, CycleResult, TaskStatus
from server.service.state import ClusterState


def exponential_buckets_range(low: float, high: float, count: int) -> list[float]:
    """Prometheus Go client's ``ExponentialBucketsRange`` (Volcano's bucket layouts)."""
    factor = math.pow(high / low, 1.0 / (count - 1))
    return [low * factor**i for i in range(count)]


# Keys of CycleResult.action_seconds that are session phases, not actions.
SESSION_PHASES = ("session.open", "session.close")
PLUGIN_PHASES = {"open": "OnSessionOpen", "close": "OnSessionClose"}


class ServerMetrics:
    """Every series of one server, in its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # --- cycles (Volcano names, milliseconds, Volcano's buckets) ---------------------------
        self.e2e_latency = Histogram(
            "volcano_e2e_scheduling_latency_milliseconds",
            "E2e scheduling latency in milliseconds (capture, snapshot, session open, actions, "
            "session close, apply, persist)",
            buckets=exponential_buckets_range(1, 5000, 20),
            registry=r,
        )
        self.open_session = Histogram(
            "volcano_open_session_duration_milliseconds",
            "Duration of opening a scheduling session in milliseconds (snapshot copy + session open)",
            buckets=exponential_buckets_range(1, 5000, 20),
            registry=r,
        )
        self.action_latency = Histogram(
            "volcano_action_scheduling_latency_milliseconds",
            "Action scheduling latency in milliseconds",
            ["action"],
            buckets=exponential_buckets_range(1, 2000, 20),
            registry=r,
        )
        self.plugin_latency = Histogram(
            "volcano_plugin_scheduling_latency_milliseconds",
            "Plugin scheduling latency in milliseconds",
            ["plugin", "OnSession"],
            buckets=exponential_buckets_range(0.1, 100, 15),
            registry=r,
        )
        self.cycles = PromCounter(
            "muster_cycles", "Scheduling cycles run, by result", ["result"], registry=r
        )
        self.cycle_binds = PromCounter(
            "muster_cycle_binds", "Bind decisions issued by cycles (tasks placed)", registry=r
        )
        self.cycle_evictions = PromCounter(
            "muster_cycle_evictions",
            "Evict decisions issued by cycles (preempt / reclaim)",
            registry=r,
        )
        self.cycle_dropped = PromCounter(
            "muster_cycle_dropped_decisions",
            "Binds / evictions a cycle decided but apply dropped (the world changed meanwhile)",
            registry=r,
        )
        self.last_cycle = Gauge("muster_last_cycle_id", "Id of the last finished cycle", registry=r)
        # --- replication (docs/ha.md) ---------------------------------------------------------
        self.leader = Gauge(
            "muster_leader", "1 while this server holds the scheduler lease, else 0", registry=r
        )
        self.term = Gauge("muster_term", "The leadership term this server last saw", registry=r)
        self.leader_changes = PromCounter(
            "muster_leader_changes",
            "Times this server became leader or stopped leading, by role taken",
            ["role"],
            registry=r,
        )
        # --- decisions --------------------------------------------------------------------------
        self.decisions_issued = PromCounter(
            "muster_decisions_issued", "Decisions issued to backends, by type", ["type"], registry=r
        )
        self.decisions_settled = PromCounter(
            "muster_decisions",
            "Decisions settled, by type and outcome (applied | rejected | expired)",
            ["type", "outcome"],
            registry=r,
        )
        self.ack_latency = Histogram(
            "muster_decision_ack_latency_seconds",
            "Seconds from issuing a decision to the backend's ack (applied or rejected)",
            ["type"],
            buckets=(
                0.001,
                0.0025,
                0.005,
                0.01,
                0.025,
                0.05,
                0.1,
                0.25,
                0.5,
                1,
                2.5,
                5,
                10,
                30,
                60,
            ),
            registry=r,
        )
        self._issued: dict[str, Any] = {}
        # --- API ----------------------------------------------------------------------------------
        self.api_requests = PromCounter(
            "muster_api_requests",
            "gRPC requests handled, by method and status code",
            ["method", "code"],
            registry=r,
        )
        self.api_latency = Histogram(
            "muster_api_request_duration_seconds",
            "gRPC unary request handling time in seconds, by method",
            ["method"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=r,
        )

    # --- cycle events ---------------------------------------------------------------------------

    def observe_cycle(
        self,
        result: CycleResult,
        e2e_seconds: float,
        snapshot_seconds: float,
        binds: int,
        evictions: int,
        dropped: int,
    ) -> None:
        self.cycles.labels("ok").inc()
        self.e2e_latency.observe(e2e_seconds * 1000.0)
        self.open_session.observe(
            (snapshot_seconds + result.action_seconds.get("session.open", 0.0)) * 1000.0
        )
        for name, seconds in result.action_seconds.items():
            if name not in SESSION_PHASES:
                self.action_latency.labels(name).observe(seconds * 1000.0)
        for key, seconds in result.plugin_seconds.items():
            plugin, _, phase = key.rpartition(".")
            self.plugin_latency.labels(plugin or key, PLUGIN_PHASES.get(phase, phase)).observe(
                seconds * 1000.0
            )
        self.cycle_binds.inc(binds)
        self.cycle_evictions.inc(evictions)
        self.cycle_dropped.inc(dropped)
        self.last_cycle.set(result.cycle_id)

    def cycle_failed(self) -> None:
        self.cycles.labels("failed").inc()

    # --- decision events (DecisionLog observer) ------------------------------------------------

    def decision_issued(self, kind: str) -> None:
        # Called per decision (10,000 in a big cycle): keep the labelled child, skip the lookup.
        child = self._issued.get(kind)
        if child is None:
            child = self._issued[kind] = self.decisions_issued.labels(kind)
        child.inc()

    def decision_settled(self, kind: str, outcome: str, seconds: float) -> None:
        self.decisions_settled.labels(kind, outcome).inc()
        if outcome != "expired":
            self.ack_latency.labels(kind).observe(max(0.0, seconds))

    # --- API events -------------------------------------------------------------------------------

    def api_request(self, method: str, code: str, seconds: float | None) -> None:
        self.api_requests.labels(method, code).inc()
        if seconds is not None:
            self.api_latency.labels(method).observe(seconds)

    # --- state ------------------------------------------------------------------------------------

    def watch_state(
        self, state: ClusterState, deserved: Callable[[], Mapping[str, Mapping[str, float]]]
    ) -> None:
        """Serve the state series at every scrape (``deserved``: the last cycle's)."""
        self.registry.register(StateCollector(state, deserved))


def _resource_families(
    prefix: str, help_: str
) -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
    return (
        GaugeMetricFamily(
            f"volcano_queue_{prefix}_milli_cpu",
            f"{help_} CPU (millicores) for one queue",
            labels=["queue_name"],
        ),
        GaugeMetricFamily(
            f"volcano_queue_{prefix}_memory_bytes",
            f"{help_} memory (bytes) for one queue",
            labels=["queue_name"],
        ),
        GaugeMetricFamily(
            f"volcano_queue_{prefix}_scalar_resources",
            f"{help_} scalar resources for one queue (milli-units; pods as a count)",
            labels=["queue_name", "resource"],
        ),
    )


def _add_resources(
    families: tuple[GaugeMetricFamily, ...], queue: str, resources: Mapping[str, float]
) -> None:
    cpu, memory, scalar = families
    cpu.add_metric([queue], float(resources.get(CPU, 0.0)))
    memory.add_metric([queue], float(resources.get(MEMORY, 0.0)))
    for name, value in sorted(resources.items()):
        if name not in (CPU, MEMORY) and math.isfinite(value):
            scalar.add_metric([queue, name], float(value))


class StateCollector(Collector):
    """State series computed from the state at scrape time (one pass over jobs and tasks)."""

    def __init__(
        self, state: ClusterState, deserved: Callable[[], Mapping[str, Mapping[str, float]]]
    ) -> None:
        self.state = state
        self.deserved = deserved

    def describe(self) -> Iterable[Metric]:
        return []  # computed at scrape; no duplicate checks needed

    def collect(self) -> Iterator[Metric]:
        state = self.state
        jobs = Counter[tuple[str, str]]()
        tasks = Counter[tuple[str, str]]()
        unschedulable_jobs = Counter[tuple[str, str]]()
        unschedulable_tasks = GaugeMetricFamily(
            "volcano_unschedule_task_count",
            "Number of tasks could not be scheduled",
            labels=["job_id"],
        )
        allocated: dict[str, dict[str, float]] = defaultdict(dict)
        for rec in state.jobs.values():
            queue = rec.queue
            jobs[(queue, short_enum_name(pb.JobPhase.DESCRIPTOR, rec.status.phase))] += 1
            active = rec.active
            pending = 0
            holds = False
            if not rec.tasks_built:  # every task Pending as submitted (not built to count them)
                tasks[(queue, TaskStatus.PENDING.title)] += rec.task_count
                pending = rec.task_count
            for t in rec.built_tasks():
                tasks[(queue, t.status.title)] += 1
                if t.status == TaskStatus.PENDING:
                    pending += 1
                elif t.status in ALLOCATED_OR_UNKNOWN:
                    holds = True
            if active and holds:  # (the template only of a job that holds something)
                alloc = allocated[queue]
                for t, tmpl in zip(rec.tasks, rec.template.tasks, strict=True):
                    if t.status in ALLOCATED_OR_UNKNOWN:
                        for name, value in tmpl.request.items():
                            alloc[name] = alloc.get(name, 0.0) + value
            if active and pending:
                gate = _unschedulable_gate(rec.status)
                if gate is not None:
                    unschedulable_jobs[(queue, gate)] += 1
                    unschedulable_tasks.add_metric([rec.id], pending)
        yield _counted(
            "muster_jobs", "Jobs held by the server, by queue and phase", ["queue", "phase"], jobs
        )
        yield _counted(
            "muster_tasks",
            "Tasks held by the server, by queue and status",
            ["queue", "status"],
            tasks,
        )
        yield GaugeMetricFamily(
            "volcano_unschedule_job_count",
            "Number of jobs could not be scheduled",
            value=sum(unschedulable_jobs.values()),
        )
        yield unschedulable_tasks
        yield _counted(
            "muster_unschedulable_jobs",
            "Pending jobs the last cycle could not schedule, by queue and gate",
            ["queue", "gate"],
            unschedulable_jobs,
        )
        yield from self._queues(allocated)
        yield from self._backends()

    def _queues(self, allocated: Mapping[str, Mapping[str, float]]) -> Iterator[Metric]:
        alloc_f = _resource_families("allocated", "Allocated")
        deserved_f = _resource_families("deserved", "Deserved")
        capacity_f = _resource_families("capacity", "Capacity")
        weight = GaugeMetricFamily(
            "volcano_queue_weight", "Weight for one queue", labels=["queue_name"]
        )
        computed = self.deserved()
        for name, entry in self.state.queues.items():
            spec = entry.spec
            _add_resources(alloc_f, name, allocated.get(name, {}))
            deserved = computed.get(name)
            if deserved is None:
                deserved = spec.deserved
            if deserved:
                _add_resources(deserved_f, name, deserved)
            capability = {r: v for r, v in spec.capability.items() if math.isfinite(v)}
            if capability:
                _add_resources(capacity_f, name, capability)
            weight.add_metric([name], spec.weight)
        yield from (*alloc_f, *deserved_f, *capacity_f, weight)

    def _backends(self) -> Iterator[Metric]:
        decisions = self.state.decisions
        registered = Counter[str]()
        connected = Counter[str]()
        silent = Counter[str]()
        contacts = self.state.liveness.contacts
        for name, rec in self.state.backends.items():
            registered[rec.kind] += 1
            if decisions.subscriber_count(name):
                connected[rec.kind] += 1
            if name in contacts and contacts[name].silent_since is not None:
                silent[rec.kind] += 1
        yield _counted(
            "muster_backends_registered", "Registered backends, by kind", ["kind"], registered
        )
        yield _counted(
            "muster_backends_connected",
            "Backends with an open decision stream, by kind",
            ["kind"],
            connected,
        )
        yield _counted(
            "muster_backends_silent",
            "Backends not heard from for the grace period (their nodes NotReady), by kind",
            ["kind"],
            silent,
        )
        pending = Counter(p.row.kind for p in decisions.pending.values())
        yield _counted(
            "muster_decisions_pending", "Decisions not yet acknowledged, by type", ["type"], pending
        )


def _unschedulable_gate(status: Any) -> str | None:
    """The gate of a job whose last verdict was Unschedulable=True, else None."""
    if not any(c.type == UNSCHEDULABLE and c.status == "True" for c in status.conditions):
        return None
    explanation = status.explanation or {}
    return str(explanation.get("gate") or "unknown")


def _counted(
    name: str, help_: str, labels: list[str], counts: Mapping[Any, int]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_, labels=labels)
    for key, value in sorted(counts.items()):
        family.add_metric(list(key) if isinstance(key, tuple) else [key], value)
    return family
