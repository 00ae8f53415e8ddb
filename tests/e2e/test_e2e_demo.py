"""Smoke test of `make demo`: scripts/demo.py --exit-when-done places and completes every example job."""

from __future__ import annotations

import subprocess
import sys

from muster_e2e import ROOT


def test_demo_runs_all_example_jobs_to_completion(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "scripts/demo.py",
            "--exit-when-done",
            "--timeout",
            "120",
            "--state-dir",
            str(tmp_path / "demo"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "4 nodes registered" in output
    assert "all jobs ended: 5/5 completed" in output
    assert "stopped server and agents" in output
    # The gang that cannot fit beside the others waits whole, then runs.
    assert "demo-big" in output
