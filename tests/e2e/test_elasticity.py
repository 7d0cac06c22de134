"""The job grows when capacity allows: more workers join a running job."""

from __future__ import annotations

import pytest
from conftest import records_exact

pytestmark = pytest.mark.e2e


def test_job_grows_to_max_workers(train_run):
    run = train_run("--epochs", "4", "--workers", "1", "--max-workers", "2", "--grow-after", "1")
    assert run.start().wait() == 0, run.log()[-3000:]
    summary = run.summary()
    assert records_exact(summary)
    live = [n for _, n in summary["workers_timeline"]]
    assert live[:2] == [0, 1] and 2 in live, summary["workers_timeline"]
    assert max(live) == 2, "never beyond --max-workers"
    assert summary["restarts"]["worker"] == 0
    [grow] = summary["worker_sizing"]["decisions"]
    assert (grow["action"], grow["workers_from"], grow["workers_to"]) == ("grow", 1, 2)
    assert f"1 -> 2 workers: {grow['reason']}" in run.log()
    assert grow["reason"] == "all 1 workers have run for 1 s (--max-workers=2)"
    assert {w["id"]: w["state"] for w in run.status()["workers"]} == {
        "worker-0": "succeeded",
        "worker-1": "succeeded",
    }
