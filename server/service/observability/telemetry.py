"""``Telemetry``: the one object the server wires in for traces and metrics.

    telemetry = Telemetry(otlp_endpoint=opts.otlp_endpoint, metrics_listen=opts.metrics_listen)
    server = grpc.aio.server(interceptors=telemetry.interceptors())
    telemetry.attach(state)                     # state metrics, decision hooks
    tg.start_soon(telemetry.run)                # /metrics until cancelled
    with telemetry.cycle(capture) as obs: ...   # in the cycle loop
    telemetry.shutdown()                        # flush spans

With neither tracing nor metrics configured every hook is a cheap no-op: no interceptor is
installed, no span is built, no decision is touched.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc
import grpc
import structlog
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from muster.tracing import build_provider, inject_current, tracing_settings
from muster.v1 import muster_pb2 as pb
from server.model import CycleResult
from server.service.observability.cycletrace import CycleObservation
from server.service.observability.http import MetricsServer
from server.service.observability.interceptor import TelemetryInterceptor
from server.service.observability.metrics import ServerMetrics
from server.service.snapshot import Capture
from server.service.state import ClusterState

log = structlog.get_logger("muster.telemetry")

SUBMISSIONS_KEPT = 100_000
SHUTDOWN_SECONDS = 3.0


class SubmissionIndex:
    """Job id -> span context of its SubmitJob, until the cycle that places the job links to it.

    Bounded (oldest dropped first): a job that waits behind 100,000 newer submissions loses its
    link, nothing else. In memory only: jobs restored after a restart have no link.
    """

    def __init__(self, capacity: int = SUBMISSIONS_KEPT) -> None:
        self.capacity = capacity
        self._contexts: OrderedDict[str, trace.SpanContext] = OrderedDict()

    def remember(self, job_id: str, ctx: trace.SpanContext) -> None:
        if not ctx.is_valid:
            return
        self._contexts[job_id] = ctx
        self._contexts.move_to_end(job_id)
        while len(self._contexts) > self.capacity:
            self._contexts.popitem(last=False)

    def take(self, job_id: str) -> trace.SpanContext | None:
        return self._contexts.pop(job_id, None)

    def __len__(self) -> int:
        return len(self._contexts)


class Telemetry:
    def __init__(
        self,
        *,
        otlp_endpoint: str | None = None,
        metrics_listen: str | None = None,
        service_name: str = "muster-server",
        tracer_provider: TracerProvider | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._owns_provider = tracer_provider is None
        if tracer_provider is None:
            settings = tracing_settings(otlp_endpoint, service_name, env)
            if settings is not None:
                tracer_provider = build_provider(settings)
                log.info(
                    "tracing.enabled", endpoint=settings.endpoint, service=settings.service_name
                )
        self.provider = tracer_provider
        self.tracer: trace.Tracer | None = (
            tracer_provider.get_tracer("muster.server") if tracer_provider else None
        )
        self.metrics: ServerMetrics | None = ServerMetrics() if metrics_listen else None
        self.metrics_server = (
            MetricsServer(self.metrics.registry, metrics_listen)
            if self.metrics and metrics_listen
            else None
        )
        self.submissions = SubmissionIndex()
        self._stamped_ctx: trace.SpanContext | None = None
        self._stamp: dict[str, str] = {}
        self.state: ClusterState | None = None
        # Computed deserved share per queue from the last cycle, if the core reports it.
        self.deserved: dict[str, dict[str, float]] = {}

    @classmethod
    def disabled(cls) -> Telemetry:
        """No tracing, no metrics, whatever the environment says (components built alone)."""
        return cls(env={})

    @property
    def enabled(self) -> bool:
        return self.tracer is not None or self.metrics is not None

    @property
    def metrics_port(self) -> int:
        return self.metrics_server.port if self.metrics_server else 0

    # --- wiring ------------------------------------------------------------------------------------

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        if not self.enabled:
            return []
        hooks = {"SubmitJob": self._submitted} if self.tracer is not None else {}
        return [TelemetryInterceptor(self.tracer, self.metrics, hooks)]

    def attach(self, state: ClusterState) -> None:
        """Observe ``state``: state metrics at scrape time; decisions counted and given the
        current trace context (the cycle's ``apply`` span, or the RPC that caused them)."""
        self.state = state
        if self.metrics is not None:
            self.metrics.watch_state(state, lambda: self.deserved)
        if self.enabled:
            state.decisions.observer = self

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[Any] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve /metrics (if configured) until cancelled."""
        if self.metrics_server is None:
            task_status.started()
            await anyio.sleep_forever()
            return
        await self.metrics_server.run(task_status=task_status)

    def shutdown(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Export what is buffered and stop the exporter (only a provider we built), waiting at
        most ``timeout`` seconds: an unreachable collector (the exporter retries for up to
        OTEL_EXPORTER_OTLP_TIMEOUT) must not hold up the server's exit."""
        if self.provider is None or not self._owns_provider:
            return
        closer = threading.Thread(target=self.provider.shutdown, name="otel-shutdown", daemon=True)
        closer.start()
        closer.join(timeout)
        if closer.is_alive():
            log.warning(
                "tracing.shutdown_timeout", seconds=timeout, note="unexported spans dropped"
            )

    # --- hooks -------------------------------------------------------------------------------------

    def _submitted(
        self, request: pb.SubmitJobRequest, response: pb.SubmitJobResponse, span: trace.Span
    ) -> None:
        if response.created:
            self.submissions.remember(response.job.spec.id, span.get_span_context())

    def leadership(self, leading: bool, term: int) -> None:
        """A change of this server's role: metrics, and a span (a trace per lease change)."""
        if self.metrics is not None:
            self.metrics.leader.set(1 if leading else 0)
            self.metrics.term.set(term)
            self.metrics.leader_changes.labels("leader" if leading else "follower").inc()
        if self.tracer is not None:
            name = "lease.acquired" if leading else "lease.lost"
            with self.tracer.start_as_current_span(name) as span:
                span.set_attribute("muster.term", term)

    def on_issue(self, decision: pb.Decision, kind: str) -> None:
        """DecisionLog observer: a decision is being issued (before it is sent)."""
        if self.tracer is not None:
            # Every decision of a cycle has the same parent (the apply span): format it once.
            ctx = trace.get_current_span().get_span_context()
            if ctx is not self._stamped_ctx:
                self._stamped_ctx, self._stamp = ctx, inject_current()
            if self._stamp:
                decision.trace_context.update(self._stamp)
        if self.metrics is not None:
            self.metrics.decision_issued(kind)

    def on_settle(self, decision: pb.Decision, kind: str, outcome: str) -> None:
        """DecisionLog observer: a pending decision was applied, rejected or expired."""
        if self.metrics is not None:
            created = decision.created.seconds + decision.created.nanos / 1e9
            self.metrics.decision_settled(kind, outcome, time.time() - created if created else 0.0)

    # --- cycles ------------------------------------------------------------------------------------

    def cycle(self, capture: Capture) -> CycleObservation:
        attributes: dict[str, Any] = {}
        if self.tracer is not None:
            attributes = {
                "muster.cycle.jobs": len(capture.jobs),
                "muster.cycle.nodes": len(capture.nodes),
                "muster.cycle.queues": len(capture.queues),
            }
        return CycleObservation(
            capture.cycle_id,
            tracer=self.tracer,
            metrics=self.metrics,
            attributes=attributes,
            submission_of=self.submissions.take,
            placed_of=self.placed_jobs,
            on_finish=self._cycle_finished,
        )

    def _cycle_finished(self, result: CycleResult) -> None:
        # The core may report each queue's computed deserved share (proportion / capacity).
        deserved = getattr(result, "queue_deserved", None)
        if deserved:
            self.deserved = {q: dict(r) for q, r in deserved.items()}

    def placed_jobs(self, result: CycleResult) -> list[str]:
        """Jobs whose binds of this cycle the state kept (only computed when tracing)."""
        if self.tracer is None or self.state is None:
            return []
        return self.state.jobs_placed_by(result.binds)
