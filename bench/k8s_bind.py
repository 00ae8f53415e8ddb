"""Bind throughput through the Kubernetes adapter against the test API server.

    .venv/bin/python bench/k8s_bind.py [--pods 1000] [--gang 10] [--nodes 100] [--server real|mini]

Creates N pending pods (PodGroups of --gang pods; --gang 1: pods without a group), starts a Muster
server in-process (the real one by default, ``mini`` = the tests' small scheduler) and the
adapter, and measures how fast the pods get bound through ``pods/binding``. Prints JSON.
Speed is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tests" / "k8s" / f"{name}.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


async def bench(args: argparse.Namespace) -> dict:
    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(
            int(os.environ.get("BENCH_LOG_LEVEL", "40"))
        )
    )
    fake = _load("fake_apiserver")
    from adapters.k8s.adapter import K8sBackend
    from adapters.k8s.kube import make_api_client

    kube = fake.FakeApiServer(bookmark_interval=1.0)
    await kube.start()
    for i in range(args.nodes):
        kube.put_object(fake.make_node(f"node-{i:04d}", cpu="64", memory="256Gi", pods="250"))
    for g in range(0, args.pods, args.gang):
        group = f"pg-{g // args.gang:04d}" if args.gang > 1 else None
        if group:
            kube.put_object(fake.make_volcano_podgroup(group, min_member=args.gang))
        for i in range(g, min(g + args.gang, args.pods)):
            kube.put_object(fake.make_pod(f"pod-{i:05d}", cpu="500m", memory="1Gi", group=group))

    tmp = tempfile.TemporaryDirectory()
    if args.server == "real":
        from server.service.app import ServerOptions, start_server

        server = await start_server(
            ServerOptions(
                listen="127.0.0.1:0", state=os.path.join(tmp.name, "m.db"), cycle_period=0.2
            )
        )
        address, stop = server.address, server.stop
    else:
        mini = _load("mini_muster").MiniMusterHandle()
        await mini.start()
        address, stop = mini.address, mini.stop

    api = await make_api_client(host=kube.url)
    backend = K8sBackend(
        api,
        server=address,
        bind_concurrency=args.concurrency,
        runtime_options={"batch_linger": 0.02, "max_batch": 2000},
    )
    started = time.perf_counter()
    task = asyncio.create_task(backend.run())

    def bound() -> int:
        return sum(1 for p in kube.list_objects("v1", "Pod") if p["spec"].get("nodeName"))

    first_bind = None
    deadline = started + args.timeout
    count = 0
    while time.perf_counter() < deadline:
        binds = backend.stats.binds
        if binds and first_bind is None:
            first_bind = time.perf_counter()
        if binds >= args.pods:
            count = bound()
            if count >= args.pods:
                break
        await asyncio.sleep(0.01)
    done = time.perf_counter()
    count = bound()
    backend.stop()
    await asyncio.wait_for(task, 30)
    await api.close()
    await stop()
    await kube.stop()
    tmp.cleanup()
    bind_window = done - (first_bind or done)
    return {
        "bench": "k8s_bind",
        "server": args.server,
        "pods": args.pods,
        "gang_size": args.gang,
        "nodes": args.nodes,
        "bind_concurrency": args.concurrency,
        "bound": count,
        "bind_posts": sum(1 for m, p in kube.requests if m == "POST" and p.endswith("/binding")),
        "seconds_adapter_start_to_all_bound": round(done - started, 3),
        "seconds_first_to_last_bind": round(bind_window, 3),
        "binds_per_second": round(count / bind_window, 1) if bind_window > 0 else None,
        "binds_per_second_end_to_end": round(count / (done - started), 1),
        "events_written": backend.stats.events,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=1000)
    p.add_argument("--gang", type=int, default=10)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--server", choices=("real", "mini"), default="real")
    p.add_argument("--timeout", type=float, default=300)
    print(json.dumps(asyncio.run(bench(p.parse_args())), indent=2))


if __name__ == "__main__":
    main()
