"""TensorFlow's thread pools follow ELASTIC_STEP_CPU_LIMIT (set by the Kubernetes backend from
the container's CPU limit). Each case runs in a fresh interpreter: the pools can be sized only
before TensorFlow runs its first op."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elastic_step.model.tf_runtime import CPU_LIMIT_ENV, inter_op_threads, thread_counts

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from elastic_step.model import tf_runtime
tf_runtime.import_tensorflow_quietly()
import tensorflow as tf
again = tf_runtime.configure_threads()  # as the worker's main() does: a no-op by now
t = tf.config.threading
print(json.dumps([t.get_intra_op_parallelism_threads(), t.get_inter_op_parallelism_threads(),
                  again]))
"""


def _threads(limit: str | None) -> tuple[list, str]:
    env = {k: v for k, v in os.environ.items() if k != CPU_LIMIT_ENV}
    env.pop("ELASTIC_STEP_TF_LOGS", None)
    if limit is not None:
        env[CPU_LIMIT_ENV] = limit
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


@pytest.mark.parametrize(
    ("limit", "expected"),
    [("3", [3, 2, [3, 2]]), ("1", [1, 1, [1, 1]]), (None, [0, 0, None])],
    ids=["3-cpus", "1-cpu", "no-limit-keeps-defaults"],
)
def test_the_cpu_limit_sizes_tensorflows_thread_pools(limit, expected) -> None:
    counts, _ = _threads(limit)
    assert counts == expected


def test_too_late_to_size_the_pools_is_a_warning_not_a_crash() -> None:
    code = (
        "import os, tensorflow as tf; tf.constant(1)\n"
        f"os.environ['{CPU_LIMIT_ENV}'] = '2'\n"
        "from elastic_step.model.tf_runtime import configure_threads\n"
        "print(configure_threads())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != CPU_LIMIT_ENV}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "None"
    assert "already running" in result.stderr


@pytest.mark.parametrize(
    ("value", "expected"),
    [("4", (4, 2)), ("2", (2, 2)), ("0.5", (1, 1)), ("1", (1, 1)), ("", None),
     ("0", None), ("-2", None), ("many", None), ("16", (16, 2))],
)  # fmt: skip
def test_thread_counts(value, expected) -> None:
    assert thread_counts({CPU_LIMIT_ENV: value}) == expected
    assert thread_counts({}) is None


def test_inter_op_threads_stay_small() -> None:
    assert [inter_op_threads(n) for n in (1, 2, 8, 64)] == [1, 2, 2, 2]
