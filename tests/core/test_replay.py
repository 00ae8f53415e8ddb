"""bench/replay.py on a small synthetic trace in the openb format (written to tmp_path)."""

from __future__ import annotations

from pathlib import Path

import pytest
from core_helpers import load_bench

replay = load_bench("replay")

NODES = """sn,cpu_milli,memory_mib,gpu,model
node-0,32000,131072,4,G2
node-1,32000,131072,4,G2
node-2,16000,65536,2,T4
node-3,16000,65536,2,T4
"""
PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
pod-0,4000,8192,1,1000,,LS,Running,0,10,0
pod-1,2000,4096,1,500,,LS,Running,1,10,1
pod-2,2000,4096,1,300,,BE,Running,2,10,2
pod-3,8000,16384,2,1000,G2,LS,Running,3,10,3
pod-4,6000,8192,0,0,,BE,Running,4,10,4
pod-5,1000,2048,1,700,T4|G2,LS,Running,5,10,5
"""
EXPECTED = (
    "workload,sc_policy,tune,seed,total_gpus,0,50,100,130\n"
    + "".join(
        f"synthetic_pods,{policy},1.3,{seed},12,{v},{v + 40},{v + 80},{v + 85}\n"
        for policy, v in (("06-FGD", 1.0), ("01-Random", 0.5))
        for seed in (42, 43)
    )
    + "other_pods,06-FGD,1.3,42,12,9,9,9,9\nsynthetic_pods,06-FGD,1.5,42,12,9,9,9,9\n"
)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    (tmp_path / replay.NODE_FILE).write_text(NODES)
    (tmp_path / "synthetic_pods.csv").write_text(PODS)
    (tmp_path / "five_columns.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,8,1000\n"
    )
    (tmp_path / "fgd-expected-results").mkdir()
    (tmp_path / replay.EXPECTED_FILE).write_text(EXPECTED)
    return tmp_path


def test_reads_nodes_pods_and_the_published_results(trace: Path) -> None:
    nodes = replay.load_nodes(trace / replay.NODE_FILE)
    assert [(n.name, n.gpus, n.model) for n in nodes][:1] == [("node-0", 4, "G2")]
    assert replay.capacity_milli(nodes) == 12000
    pods = {p.name: p for p in replay.load_pods(trace / "synthetic_pods.csv")}
    assert pods["pod-1"].fraction == 0.5
    assert pods["pod-1"].gpu_request_milli == 500
    assert pods["pod-3"].fraction == 0.0
    assert pods["pod-3"].gpu_request_milli == 2000
    assert pods["pod-3"].gpu_spec == ("G2",)
    assert pods["pod-5"].gpu_spec == ("T4", "G2")
    assert pods["pod-4"].gpu_request_milli == 0
    (five,) = replay.load_pods(trace / "five_columns.csv")
    assert five.gpu_request_milli == 8000
    assert five.gpu_spec == ()

    published = replay.load_expected(trace / replay.EXPECTED_FILE, "synthetic_pods", 1.3)
    assert set(published) == {"06-FGD", "01-Random"}
    assert published["06-FGD"] == {0: 1.0, 50: 41.0, 100: 81.0, 130: 86.0}
    assert (
        replay.load_expected(trace / replay.EXPECTED_FILE, "synthetic_pods", 1.3, [43])[
            "01-Random"
        ][130]
        == 85.5
    )


def test_sampling_is_the_simulators_workload_tuning_and_is_seeded(trace: Path) -> None:
    pods = replay.load_pods(trace / "synthetic_pods.csv")
    drawn = replay.sample_pods(pods, 12000, 1.3, 42)
    # Every pod of the list once (shuffled), then draws until the next would pass 1.3 x capacity.
    assert sorted(p.name.rsplit("-", 1)[0] for p in drawn[: len(pods)]) == sorted(
        p.name for p in pods
    )
    asked = sum(p.gpu_request_milli for p in drawn)
    assert 1.3 * 12000 - 2000 < asked <= 1.3 * 12000
    assert len(drawn) > len(pods)
    assert len({p.name for p in drawn}) == len(drawn)
    # A list asking more than the target loses pods drawn at random until it no longer does.
    down = replay.sample_pods(pods, 4000, 0.5, 42)
    assert sum(p.gpu_request_milli for p in down) <= 2000
    assert len(down) < len(pods)
    assert [p.name for p in replay.sample_pods(pods, 12000, 1.3, 42)] == [p.name for p in drawn]
    assert [p.name for p in replay.sample_pods(pods, 12000, 1.3, 43)] != [p.name for p in drawn]
    with pytest.raises(ValueError, match="the pod list asks for no GPU"):
        replay.sample_pods([p for p in pods if not p.num_gpu], 12000, 1.3, 42)


def test_pods_are_placed_in_arrival_order_and_a_pod_that_fits_nowhere_stays_pending() -> None:
    nodes = [replay.TraceNode("n", 8000, 16384, 1, "G2")]
    pods = [
        replay.TracePod("a", 1000, 1024, 1, 600),
        replay.TracePod("b", 1000, 1024, 1, 1000),  # the GPU is shared: no whole GPU left
        replay.TracePod("c", 1000, 1024, 1, 400),  # still fits beside a
        replay.TracePod("d", 1000, 1024, 1, 100),  # the GPU is full
        replay.TracePod("e", 1000, 1024, 0, 0, ()),  # cpu only
        replay.TracePod("f", 1000, 1024, 1, 100, ("T4",)),  # no T4 node
    ]
    for policy in replay.POLICIES:
        placed = replay.replay(nodes, pods, replay.policy_config(policy, 42))
        assert placed == [True, False, True, False, True, False], policy
    # Arrived 60, 160, 200, 210, 210, 220 %; allocated 60, 60, 100, 100, 100, 100 %. At 200 %: the
    # mean over the arrivals rounding to it; 160 % is one arrival within one point; 0-150 % have
    # none near: the allocation once arrivals first reach them.
    curve = replay.allocation_curve(
        pods, [True, False, True, False, True, False], 1000, [0, 50, 100, 150, 159, 200, 209, 300]
    )
    assert curve == {
        0: 60.0,
        50: 60.0,
        100: 60.0,
        150: 60.0,
        159: 60.0,
        200: 100.0,
        209: 100.0,
        300: None,
    }


@pytest.mark.parametrize("policy", replay.POLICIES)
def test_each_policy_gives_a_sane_allocation_curve(trace: Path, policy: str) -> None:
    points = list(range(0, 131, 10))
    run = replay.run_one(trace, "synthetic_pods.csv", policy, 42, 1.3, 1, points)
    assert 0 < run.placed < run.pods
    values = [run.curve[p] for p in points]
    assert all(v is not None for v in values)
    shares = [float(v) for v in values if v is not None]
    assert shares == sorted(shares)  # no departures: the allocation only grows
    assert all(
        0 <= s <= min(p + 17, 100) for p, s in zip(points, shares, strict=True)
    )  # at most what arrived
    assert shares[-1] >= 50


def test_main_prints_the_table_beside_the_published_numbers(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replay.main(
        [
            "--trace",
            str(trace),
            "--pods",
            "synthetic_pods.csv",
            "--seeds",
            "42-43",
            "--policies",
            "fgd,random",
            "--step",
            "50",
        ]
    )
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("|")]
    assert lines[0] == "| arrival % | fgd | FGD (paper) | random | Random (paper) |"
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| 0", "| 50", "| 100", "| 130"]
    assert lines[-1].split(" | ")[2] == "86.0"  # the published FGD mean at 130 %
    assert lines[-1].split(" | ")[4] == "85.5 |"
    assert replay.parse_seeds("42-44,50") == [42, 43, 44, 50]
