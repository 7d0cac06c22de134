"""The master's TensorFlow (elastic_step/model/tf_runtime.py): imported with oneDNN's kernels
off, whose pool would keep the memory of the model the master checked, unless the user set
TF_ENABLE_ONEDNN_OPTS; and the processes it starts do not inherit that setting. Each case
runs in a process of its own: TensorFlow reads the switch once, as it is imported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

IMPORT = (
    "import os; from elastic_step.model.tf_runtime import import_tensorflow_quietly as i; "
    "i(quietly=False, master={master}); print(os.environ.get('TF_ENABLE_ONEDNN_OPTS'))"
)
#: TensorFlow's banner when its oneDNN kernels are on.
ONEDNN_ON = "oneDNN custom operations are on"


def run(master: bool, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    return subprocess.run(
        [sys.executable, "-c", IMPORT.format(master=master)],
        capture_output=True, text=True, timeout=120, env={**environ, **env},
    )  # fmt: skip


@pytest.mark.parametrize("master", [True, False])
def test_a_master_imports_tensorflow_without_onednn_and_passes_nothing_on(master) -> None:
    result = run(master)
    assert result.returncode == 0, result.stderr
    assert (ONEDNN_ON in result.stderr) is not master
    assert result.stdout.strip() == "None"  # what its workers and PS inherit


def test_the_users_own_onednn_setting_wins() -> None:
    result = run(True, TF_ENABLE_ONEDNN_OPTS="1")
    assert result.returncode == 0, result.stderr
    assert ONEDNN_ON in result.stderr
    assert result.stdout.strip() == "1"
