"""bench/backfill.py on a small synthetic trace in Gavel's format (written to tmp_path)."""

from __future__ import annotations

from pathlib import Path

import pytest
from core_helpers import load_bench

backfill = load_bench("backfill")


def trace_line(job_type: str, steps: int, arrival: float, gpus: int, limit: str = "") -> str:
    fields = [
        job_type,
        "cd %s && python3 train.py",
        "--steps",
        "1",
        str(steps),
        f"{arrival}",
        str(gpus),
    ]
    if limit:
        fields.append(limit)
    return "\t".join(fields)


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    """A stream of 1-GPU jobs every 10 minutes on a 2-node cluster, with two 16-GPU gangs."""
    lines = []
    for k in range(40):
        lines.append(trace_line("A", 1000 * (1 + k % 5), 600.0 * k, 1))
        if k in (3, 15):
            lines.append(trace_line("B", 3000, 600.0 * k + 1, 16))
    sub = tmp_path / "gavel-msr-seed0"
    sub.mkdir()
    (sub / "vc1.trace").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_lengths_keep_each_jobs_place_in_its_types_distribution() -> None:
    jobs = [
        backfill.TraceJob(0, "A", 100, 0.0, 1, None),
        backfill.TraceJob(1, "A", 300, 0.0, 1, None),
        backfill.TraceJob(2, "B", 10, 0.0, 1, None),
    ]
    lengths = backfill.job_lengths(jobs, 2.0)
    assert lengths == [3600.0, 3 * 3600.0, 2 * 3600.0]  # medians: A 200, B 10


def test_the_trace_limit_column_wins_over_the_factor(tmp_path: Path) -> None:
    path = tmp_path / "x.trace"
    path.write_text(trace_line("A", 10, 0.0, 1, "999") + "\n" + trace_line("A", 10, 5.0, 2) + "\n")
    jobs = backfill.prepare(backfill.load_trace(path), 10, 1.0, 2.0)
    assert [j.limit for j in jobs] == [999.0, 7200.0]
    assert backfill.tasks_of(20, 8) == [8, 8, 4]


def test_reservations_cut_the_wait_of_large_gangs(trace_dir: Path) -> None:
    trace = backfill.load_trace(backfill.trace_file(trace_dir, "vc1"))
    jobs = backfill.prepare(trace, 100, 1.0, 1.5)
    off = backfill.simulate("volcano", jobs, 2, large=8, depth=1)
    on = backfill.simulate("volcano-res", jobs, 2, large=8, depth=1)
    assert len(on.large_waits) == len(off.large_waits) == 2
    assert max(on.large_waits) < max(off.large_waits)
    assert on.broken == 0
    assert on.reserved >= 1
    assert on.unstarted == off.unstarted == 0


def test_the_table_prints(trace_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    backfill.main(
        ["--trace", str(trace_dir), "--vc", "vc1", "--jobs", "30", "--runs", "volcano,kai-res"]
    )
    out = capsys.readouterr().out
    assert "| volcano |" in out
    assert "| kai-res |" in out
