"""One scheduling cycle as seen by telemetry: its trace, its metrics, its log context.

The trace of a cycle::

    cycle                              root; counts as attributes, per-job events, links
    ├── snapshot                       deep copy of the captured state (worker thread)
    ├── session.open                   plugin open timings as attributes
    ├── action.enqueue / action.allocate / action.preempt / ...
    ├── session.close                  plugin close timings as attributes
    ├── apply                          decisions issued here carry its W3C context
    └── store.flush                    persisting the cycle's changes

The core (``SchedulerCore.run_cycle``) knows nothing of OpenTelemetry: it records seconds per
session phase / action / plugin in ``CycleResult``; the spans between ``snapshot`` and ``apply``
are laid out afterwards, back to back from the moment the core started, with explicit times.
``cycle`` and ``apply`` are real, current spans (so logs and decisions see them).

Per-job detail is bounded: at most ``max_job_events`` events per cycle (placed jobs first, then
pending ones with their gate and summary) and ``max_links`` links to the SubmitJob spans of the
jobs placed; what does not fit is counted in ``muster.events.omitted`` / ``muster.links.omitted``.
A 10,000-job cycle costs one pass over its job outcomes.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import structlog
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from server.model import CycleResult
from server.service.observability.metrics import SESSION_PHASES, ServerMetrics

MAX_JOB_EVENTS = 64
MAX_LINKS = 64


class CycleObservation:
    """Use as ``with telemetry.cycle(capture) as obs: ... obs.finish(...)``.

    Leaving the block without ``finish`` (an exception, a cancelled cycle) marks the cycle span
    as failed and counts a failed cycle.
    """

    def __init__(
        self,
        cycle_id: int,
        *,
        tracer: trace.Tracer | None,
        metrics: ServerMetrics | None,
        attributes: dict[str, Any],
        submission_of: Callable[[str], trace.SpanContext | None] = lambda _job: None,
        placed_of: Callable[[CycleResult], list[str]] = lambda _result: [],
        on_finish: Callable[[CycleResult], None] = lambda _result: None,
        max_job_events: int = MAX_JOB_EVENTS,
        max_links: int = MAX_LINKS,
    ) -> None:
        self.cycle_id = cycle_id
        self.tracer = tracer
        self.metrics = metrics
        self.submission_of = submission_of
        self.placed_of = placed_of
        self.on_finish = on_finish
        self.max_job_events = max_job_events
        self.max_links = max_links
        self.started_ns = time.time_ns()
        self._perf0 = time.perf_counter()
        self._snapshot_ns: int | None = None
        self._core_end_ns: int | None = None
        self._apply_end_ns: int | None = None
        self._stack = ExitStack()
        self._finished = False
        self.root: trace.Span = trace.INVALID_SPAN
        self.apply_span: trace.Span = trace.INVALID_SPAN
        if tracer is not None:
            attrs = {"muster.cycle.id": cycle_id, **attributes}
            self.root = tracer.start_span("cycle", attributes=attrs, start_time=self.started_ns)

    @property
    def traced(self) -> bool:
        return self.tracer is not None

    def __enter__(self) -> CycleObservation:
        self._stack.enter_context(structlog.contextvars.bound_contextvars(cycle_id=self.cycle_id))
        if self.tracer is not None:
            self._stack.enter_context(trace.use_span(self.root, end_on_exit=False))
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if not self._finished:
                if self.metrics is not None:
                    self.metrics.cycle_failed()
                if self.tracer is not None:
                    if exc is not None:
                        self.root.record_exception(exc)
                    self.root.set_status(Status(StatusCode.ERROR, "cycle did not complete"))
                    self.root.end()
        finally:
            self._stack.close()

    def fail(self, exc: BaseException) -> None:
        """The cycle failed and the caller handles the error: end the span now."""
        if self._finished:
            return
        self._finished = True
        if self.metrics is not None:
            self.metrics.cycle_failed()
        if self.tracer is not None:
            self.root.record_exception(exc)
            self.root.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            self.root.end()

    # --- marks on the timeline -------------------------------------------------------------------

    def snapshot_done(self) -> None:
        self._snapshot_ns = time.time_ns()

    def core_done(self) -> None:
        self._core_end_ns = time.time_ns()

    @contextmanager
    def applying(self) -> Iterator[None]:
        """Applying the result: the ``apply`` span is current (decisions issued carry it)."""
        if self._core_end_ns is None:
            self.core_done()
        if self.tracer is None:
            yield
            self._apply_end_ns = time.time_ns()
            return
        self.apply_span = self.tracer.start_span(
            "apply", context=trace.set_span_in_context(self.root), start_time=self._core_end_ns
        )
        try:
            with trace.use_span(self.apply_span, end_on_exit=False):
                yield
        finally:
            self._apply_end_ns = time.time_ns()
            self.apply_span.end(end_time=self._apply_end_ns)

    # --- the end -----------------------------------------------------------------------------------

    def finish(
        self,
        result: CycleResult,
        *,
        binds: int,
        evictions: int,
        dropped: int,
    ) -> None:
        """The cycle is done (applied and persisted): record metrics, complete the trace."""
        if self._finished:
            return
        self._finished = True
        self.on_finish(result)
        end_ns = time.time_ns()
        e2e = time.perf_counter() - self._perf0
        snapshot_ns = self._snapshot_ns or self.started_ns
        if self.metrics is not None:
            self.metrics.observe_cycle(
                result,
                e2e,
                (snapshot_ns - self.started_ns) / 1e9,
                binds=binds,
                evictions=evictions,
                dropped=dropped,
            )
        if self.tracer is None:
            return
        root = self.root
        parent = trace.set_span_in_context(root)
        tracer = self.tracer
        tracer.start_span("snapshot", context=parent, start_time=self.started_ns).end(
            end_time=snapshot_ns
        )
        self._core_spans(result, parent, snapshot_ns)
        apply_end = self._apply_end_ns or self._core_end_ns or snapshot_ns
        tracer.start_span("store.flush", context=parent, start_time=apply_end).end(end_time=end_ns)
        root.set_attributes(
            {
                "muster.cycle.tasks_placed": binds,
                "muster.cycle.evictions": evictions,
                "muster.cycle.dropped": dropped,
                "muster.cycle.pipelined": len(result.pipelined),
                "muster.cycle.seconds": e2e,
            }
        )
        self._job_detail(result, self.placed_of(result))
        root.end(end_time=end_ns)

    def _core_spans(self, result: CycleResult, parent: Any, start_ns: int) -> None:
        """session.open, action.*, session.close, laid out back to back from ``start_ns`` and
        ending at the core's measured end (the small gaps between phases are not recorded)."""
        tracer = self.tracer
        assert tracer is not None
        phases = list(result.action_seconds.items())
        total_ns = sum(int(s * 1e9) for _, s in phases)
        core_end = self._core_end_ns or (start_ns + total_ns)
        # Anchor at the end: the snapshot mark precedes the core by a thread hand-off.
        t = max(start_ns, core_end - total_ns)
        open_attrs = _plugin_attributes(result, "open")
        close_attrs = _plugin_attributes(result, "close")
        for name, seconds in phases:
            span_name = name if name in SESSION_PHASES else f"action.{name}"
            attrs = (
                open_attrs
                if name == "session.open"
                else close_attrs
                if name == "session.close"
                else None
            )
            end = t + int(seconds * 1e9)
            tracer.start_span(span_name, context=parent, start_time=t, attributes=attrs).end(
                end_time=end
            )
            t = end

    def _job_detail(self, result: CycleResult, placed_jobs: list[str]) -> None:
        root = self.root
        events = 0
        omitted = 0
        placed_set = set(placed_jobs)
        for job_id in placed_jobs:
            if events < self.max_job_events:
                root.add_event("job.placed", {"muster.job.id": job_id})
                events += 1
            else:
                omitted += 1
        gates = Counter[str]()
        for job_id, outcome in result.jobs.items():
            exp = outcome.explanation
            if exp is None or exp.gate == "none" or job_id in placed_set:
                continue
            gates[exp.gate] += 1
            if events < self.max_job_events:
                root.add_event(
                    "job.pending",
                    {
                        "muster.job.id": job_id,
                        "muster.job.gate": exp.gate,
                        "muster.job.reason": exp.summary,
                    },
                )
                events += 1
            else:
                omitted += 1
        links = 0
        links_omitted = 0
        for job_id in placed_jobs:
            ctx = self.submission_of(job_id)
            if ctx is None:
                continue
            if links < self.max_links:
                root.add_link(ctx, {"muster.job.id": job_id, "muster.link": "submission"})
                links += 1
            else:
                links_omitted += 1
        attrs: dict[str, Any] = {
            "muster.cycle.jobs_placed": len(placed_jobs),
            "muster.cycle.jobs_pending": sum(gates.values()),
            "muster.events.omitted": omitted,
            "muster.links.omitted": links_omitted,
        }
        for gate, count in gates.items():
            attrs[f"muster.cycle.pending.{gate}"] = count
        root.set_attributes(attrs)


def _plugin_attributes(result: CycleResult, phase: str) -> dict[str, float]:
    suffix = f".{phase}"
    return {
        f"muster.plugin.{key.removesuffix(suffix)}.ms": round(seconds * 1000.0, 4)
        for key, seconds in result.plugin_seconds.items()
        if key.endswith(suffix)
    }
