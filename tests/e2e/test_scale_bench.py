"""bench/scale.py (make bench-scale) runs one small size end to end, so that the benchmark
cannot rot: every stage reported with its time per row and peaks, fit beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_scale_bench_runs_every_stage_at_a_small_size(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "bench/scale.py", "--sizes", "3000", "--fit-size", "3000",
         "--workdir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    document = json.loads((tmp_path / "scale.json").read_text())
    [size] = document["sizes"]
    assert size["rows"] == 3000
    stages = size["stages"]
    assert list(stages) == ["preprocess", "train", "evaluate", "predict"]
    for stage in stages.values():
        assert stage["wall_s"] > 0 and stage["us_per_row"] > 0
        assert stage["peak_rss_mb"]["main"] > 0
    assert stages["train"]["peak_rss_mb"]["workers"] > 0 and stages["train"]["peak_rss_mb"]["ps"]
    assert stages["train"]["accounting_exact"]
    assert 0.0 < stages["evaluate"]["auc"] <= 1.0
    assert stages["predict"]["rows_predicted"] == 3000
    assert document["fit"]["examples_per_s"] > 0 and "elastic_over_fit" in document["fit"]
    assert "== bench-scale: 3,000 rows; --local-steps: 4 ==" in result.stdout
