"""The master's side needs no TensorFlow: bench/master_scale.py measures it with 1,000
simulated members in one process, and asserts at the end that TensorFlow was never loaded.
Here the same bench runs small (20 simulated workers, 400 tasks), so that a change to the
master that breaks the bench, or makes the master import TensorFlow, fails long before
anyone runs `make bench-master`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    *("--workers", "20", "--shards", "4", "--tasks-per-epoch", "400"),
    *("--task-seconds", "0.05", "--warmup", "1", "--seconds", "2", "--timeout", "120"),
]


def test_the_master_scale_bench_runs_a_small_job_without_tensorflow(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "bench/master_scale.py", *SMALL, "--workdir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode in (0, 1), result.stderr[-3000:]  # 1: a target missed, small
    assert "accounting exact: PASS" in result.stdout, result.stdout[-3000:]
    report = json.loads((tmp_path / "master_scale.json").read_text())
    assert report["result"]["master_final"]["tensorflow_imported"] is False
