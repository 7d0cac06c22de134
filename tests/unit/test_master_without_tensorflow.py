"""The master's side needs no TensorFlow: bench/master_scale.py measures it with 1,000
simulated members in one process, and asserts at the end that TensorFlow was never loaded.
This catches an import that would break that bench long before anyone runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import importlib.util, sys
sys.path.insert(0, "bench")
spec = importlib.util.spec_from_file_location("master_scale", "bench/master_scale.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
import elastic_step.master.job, elastic_step.master.servicer, elastic_step.rpc.master_client
print("tensorflow" in sys.modules)
"""


def test_the_master_scale_bench_and_the_master_import_no_tensorflow() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"
