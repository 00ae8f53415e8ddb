"""Cost of telemetry on the benchmark cycle (bench/cycle.py's synthetic cluster).

    python bench/tracing_cost.py --nodes 5000 --tasks 10000 [--repeat 3]

Runs what the server's cycle loop runs around ``SchedulerCore.run_cycle`` -- the cycle
observation (root span, session / action spans laid out afterwards, bounded per-job events,
links to the submissions of the jobs placed, metrics) and the stamping of every bind decision
with the cycle's W3C trace context -- in five modes:

* ``off``: no tracing, no metrics (the default server);
* ``metrics``: Prometheus metrics only;
* ``tracing_unreachable``: tracing on, the OTLP endpoint refuses connections;
* ``tracing_export``: tracing on, exporting to an in-process OTLP receiver (sync gRPC server);
* ``tracing_export_metrics``: both.

Prints one JSON object: per mode, the median cycle seconds (core + telemetry), the median
telemetry seconds (cycle minus core, measured on the same run; it includes building the bind
decisions, which every mode does), the overhead against ``off``, the spans received, and the
seconds to flush the exporter after the runs (export happens in the SDK's background thread).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as tsp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tsg

from bench.cycle import build
from muster.logs import configure_logging
from muster.v1 import muster_pb2 as pb
from server.config import default_config
from server.scheduler import SchedulerCore
from server.service.observability import Telemetry


class CountingReceiver(tsg.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans = 0

    def Export(
        self, request: tsp.ExportTraceServiceRequest, context: Any
    ) -> tsp.ExportTraceServiceResponse:
        self.spans += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        return tsp.ExportTraceServiceResponse()


def refused_port() -> int:
    """A port with nothing listening (bound, never listened, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_cycle(
    telemetry: Telemetry, nodes: int, tasks: int, seed: int, cycle_id: int
) -> dict[str, float]:
    snapshot = build(nodes, tasks, seed)
    core = SchedulerCore(default_config())
    if telemetry.tracer is not None:  # every job was submitted through a traced SubmitJob
        submit = telemetry.tracer.start_span("muster.v1.Scheduler/SubmitJob")
        submit.end()
        for job in snapshot.jobs:
            telemetry.submissions.remember(job.uid, submit.get_span_context())
    job_of = {t.uid: j.uid for j in snapshot.jobs for t in j.tasks}
    capture = SimpleNamespace(
        cycle_id=cycle_id, jobs=snapshot.jobs, nodes=snapshot.nodes, queues=snapshot.queues
    )
    started = time.perf_counter()
    with telemetry.cycle(capture) as obs:  # type: ignore[arg-type]
        obs.snapshot_done()
        core_started = time.perf_counter()
        result = core.run_cycle(snapshot, cycle_id)
        core_seconds = time.perf_counter() - core_started
        obs.core_done()
        with obs.applying():  # what DecisionLog.issue does per bind, with the observer hook
            for i, (uid, node) in enumerate(result.binds.items()):
                decision = pb.Decision(id=i + 1, cycle_id=cycle_id, backend="bench")
                decision.bind.task_id = uid
                decision.bind.node = node
                telemetry.on_issue(decision, "bind")
        # The state after apply: every bound task is Binding on its node, so every job is placed.
        telemetry.state = SimpleNamespace(  # type: ignore[assignment]
            jobs_placed_by=lambda binds: list(dict.fromkeys(job_of[uid] for uid in binds)),
        )
        obs.finish(result, binds=len(result.binds), evictions=len(result.evictions), dropped=0)
    seconds = time.perf_counter() - started
    return {
        "cycle": seconds,
        "core": core_seconds,
        "telemetry": seconds - core_seconds,
        "placed": len(result.binds),
    }


def run_mode(
    name: str, telemetry: Telemetry, args: argparse.Namespace, receiver: CountingReceiver | None
) -> dict:
    runs = [
        one_cycle(telemetry, args.nodes, args.tasks, args.seed, i + 1) for i in range(args.repeat)
    ]
    flush_seconds = None
    if telemetry.provider is not None:
        t0 = time.perf_counter()
        telemetry.shutdown(timeout=15.0)
        flush_seconds = round(time.perf_counter() - t0, 4)
    return {
        "mode": name,
        "cycle_seconds": round(statistics.median(r["cycle"] for r in runs), 4),
        "core_seconds": round(statistics.median(r["core"] for r in runs), 4),
        "telemetry_seconds": round(statistics.median(r["telemetry"] for r in runs), 5),
        "placed": runs[0]["placed"],
        "flush_seconds": flush_seconds,
        "spans_received": receiver.spans if receiver is not None else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    configure_logging("console", "error")  # stdout is for the JSON result

    receiver = CountingReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    tsg.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        modes = [
            run_mode("off", Telemetry.disabled(), args, None),
            run_mode("metrics", Telemetry(metrics_listen="127.0.0.1:0", env={}), args, None),
            run_mode(
                "tracing_unreachable",
                Telemetry(otlp_endpoint=f"127.0.0.1:{refused_port()}", env={}),
                args,
                None,
            ),
            run_mode(
                "tracing_export",
                Telemetry(otlp_endpoint=f"127.0.0.1:{port}", env={}),
                args,
                receiver,
            ),
        ]
        receiver.spans = 0
        modes.append(
            run_mode(
                "tracing_export_metrics",
                Telemetry(otlp_endpoint=f"127.0.0.1:{port}", metrics_listen="127.0.0.1:0", env={}),
                args,
                receiver,
            )
        )
    finally:
        server.stop(0)
    base = modes[0]["telemetry_seconds"]
    for mode in modes:  # building bind decisions is in every mode; the difference is telemetry's
        mode["overhead_vs_off_seconds"] = round(mode["telemetry_seconds"] - base, 5)
    print(
        json.dumps(
            {"nodes": args.nodes, "tasks": args.tasks, "repeat": args.repeat, "modes": modes},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
