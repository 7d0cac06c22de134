"""The engine on a shared cluster's terms: poisoned tasks end the job, stops resume, resumed
jobs report the final model, chaos keeps accounting exact, and strangers are turned away."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runs import TWO_COLUMN_MODEL, classifier_definition, evaluate, run_cli
from conftest import TrainRun, mid_epoch, pid_alive, records_exact

pytestmark = pytest.mark.e2e

# A model over two numeric columns whose feed SIGKILLs the worker that reads the row with
# a == 999, as a segfault in a custom op or an OOM kill would. The master's own check of
# the definition runs the feed too, but only workers die (they have ELASTIC_STEP_INSTANCE).
POISONED_MODEL = classifier_definition(
    TWO_COLUMN_MODEL,
    optimizer="keras.optimizers.SGD(0.1)",
    preamble="""
import os, signal
import numpy as np
import tensorflow as tf
from elastic_step.data.feed import default_feed

def _die_on_poison(records):
    parsed = tf.io.parse_example(records, {"a": tf.io.FixedLenFeature([], tf.float32)})
    def check(a):
        if np.any(a.numpy() == 999.0) and os.environ.get("ELASTIC_STEP_INSTANCE"):
            os.kill(os.getpid(), signal.SIGKILL)
        return 0
    tf.py_function(check, [parsed["a"]], tf.int32)
    return records

def feed(dataset, mode, schema):
    return default_feed(dataset.map(_die_on_poison), mode, schema)
""",
)


def test_a_record_that_kills_every_worker_reading_it_fails_the_job(tmp_path: Path):
    csv = tmp_path / "poisoned.csv"
    rows = [f"{i % 7},{(i * 3) % 5},{i % 2}" for i in range(300)]
    rows[150] = "999,1,0"
    csv.write_text("a,b,label\n" + "\n".join(rows) + "\n")
    data = tmp_path / "data"
    prepared = run_cli(
        "preprocess", "--input", str(csv), "--label", "label", "--output", str(data),
    )  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr
    model_def = tmp_path / "poisoned_model.py"
    model_def.write_text(POISONED_MODEL)

    output = tmp_path / "run"
    started = time.monotonic()
    result = run_cli(
        "train", "--model-def", str(model_def), "--data", str(data), "--output", str(output),
        "--epochs", "2", "--batch-size", "16", "--records-per-task", "40",
        "--workers", "2", "--max-task-retries", "2", "--max-restarts", "10",
        timeout=240,
    )  # fmt: skip
    elapsed = time.monotonic() - started

    assert result.returncode == 1, result.stderr[-3000:]
    [error] = [line for line in result.stderr.splitlines() if line.startswith("elastic-step:")]
    assert "failed 3 times, more than --max-task-retries=2" in error
    # The poisoned row may have gone to either split: its task is named either way.
    assert re.search(r"(train|evaluate) task \d+ \(\S+ records \d+-\d+\)", error), error
    assert error.count("killed by SIGKILL") == 3, error
    summary = json.loads((output / "summary.json").read_text())
    assert summary["phase"] == "failed"
    # No endless relaunching: the record is in one task per epoch (or per evaluation round,
    # and two can be open at once), and each such task kills at most 3 workers.
    assert summary["restarts_by_reason"].get("crashed", 0) <= 2 * 3
    assert elapsed < 200
    status = json.loads((output / "status.json").read_text())
    assert all(not pid_alive(m["pid"]) for m in status["workers"] + status["ps"] if m["pid"])


def test_sigterm_while_workers_ask_for_tasks_then_resume(train_run):
    run = train_run("--epochs", "3").start()
    with run.held(mid_epoch) as status:
        first = run.member_pids(status)
        run.proc.send_signal(signal.SIGTERM)
    assert run.proc.wait(timeout=30) == 128 + signal.SIGTERM
    stopped = run.status()
    assert stopped["phase"] == "interrupted"
    # A stop is never taken for the end of the work: no instance is recorded as succeeded.
    states = {m["id"]: m["state"] for m in stopped["workers"] + stopped["ps"]}
    assert "succeeded" not in states.values(), states
    assert not any(pid_alive(pid) for pid in first.values())

    resumed = train_run("--epochs", "3", output=run.output).start()
    assert resumed.wait() == 0, resumed.log()[-3000:]
    summary = resumed.summary()
    assert records_exact(summary), summary["epochs"]
    final = resumed.status()
    # Every slot was relaunched: one new PS and two new workers finished the job.
    succeeded = sorted(m["id"] for m in final["workers"] + final["ps"] if m["state"] == "succeeded")
    assert len(succeeded) == 3 and not set(succeeded) & set(first), succeeded
    assert summary["restarts"]["master"] == 1


def test_resumed_job_requeues_lost_tasks_at_once_and_reports_the_final_model(
    train_run, digits_data, tmp_path
):
    # A long --task-timeout: a lease left to run out would hold the job for 10 minutes.
    # 8 epochs: at 4 the run could end before the test saw epoch 2 under way.
    args = ("--epochs", "8", "--evaluation-steps", "15", "--task-timeout", "600")
    run = train_run(*args).start()
    with run.held(lambda s: mid_epoch(s) and s["epoch"] >= 2) as status:
        workers = {m["id"]: m["pid"] for m in status["workers"] if m["state"] == "running"}
        run.proc.send_signal(signal.SIGKILL)
        run.proc.wait(timeout=10)
        for pid in workers.values():  # the workers die while no master watches, tasks in hand
            os.killpg(pid, signal.SIGKILL)

    resumed = train_run(*args, output=run.output).start()
    started = time.monotonic()
    assert resumed.wait(timeout=240) == 0, resumed.log()[-3000:]
    assert time.monotonic() - started < 200
    log = resumed.log()
    assert "made no progress" not in log
    assert "re-queued" in log
    summary = resumed.summary()
    assert records_exact(summary)

    # Evaluations are listed in epoch order, each with the model version it measured.
    evaluations = summary["evaluations"]
    assert [(e["epoch"], e["round"]) for e in evaluations] == sorted(
        (e["epoch"], e["round"]) for e in evaluations
    )
    assert evaluations[-1]["trigger"] == "epoch-end" and evaluations[-1]["epoch"] == 8
    assert all(e["min_model_version"] <= e["model_version"] for e in evaluations)

    # The final metrics are the final model's: evaluate on the saved model agrees.
    evaluation = evaluate(resumed.output, digits_data, tmp_path / "metrics.json")
    assert evaluation["metrics"]["accuracy"] == pytest.approx(
        summary["metrics"]["accuracy"], abs=1e-6
    )
    assert evaluation["loss"] == pytest.approx(summary["metrics"]["loss"], rel=1e-4)

    # A finished job run again with other settings is refused, naming what differs.
    other = TrainRun(digits_data, resumed.output, "--epochs", "5")
    result = subprocess.run(other.argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    [line] = [x for x in result.stderr.splitlines() if x.startswith("elastic-step: error")]
    assert "finished job with other settings (--epochs differ)" in line


UNAUTHENTICATED_PROBE = """
import sys, grpc
from elastic_step.rpc import master_pb2, master_pb2_grpc, ps_pb2, ps_pb2_grpc
master, ps = sys.argv[1], sys.argv[2]
codes = []
stub = master_pb2_grpc.MasterStub(grpc.insecure_channel(master))
for method, request in [
    ("Register", master_pb2.RegisterRequest(role=master_pb2.PS, name="ps-0", shard=0,
                                            address="127.0.0.1:1")),
    ("GetPSAddresses", master_pb2.GetPSAddressesRequest()),
    ("NextTask", master_pb2.NextTaskRequest(worker="worker-0")),
    ("Heartbeat", master_pb2.HeartbeatRequest(name="worker-0")),
]:
    try:
        getattr(stub, method)(request, timeout=10)
        codes.append(f"master.{method}=OK")
    except grpc.RpcError as e:
        codes.append(f"master.{method}={e.code().name}")
stub = ps_pb2_grpc.ParameterServerStub(grpc.insecure_channel(ps))
for method, request in [
    ("Initialize", ps_pb2.InitializeRequest()),
    ("Pull", ps_pb2.PullRequest()),
    ("Push", ps_pb2.PushRequest()),
]:
    try:
        getattr(stub, method)(request, timeout=10)
        codes.append(f"ps.{method}=OK")
    except grpc.RpcError as e:
        codes.append(f"ps.{method}={e.code().name}")
print(" ".join(codes))
"""


@pytest.mark.timeout(600)  # kills, replacements and a PS restore: minutes on 2 loaded cores
def test_chaos_random_worker_kills_and_a_ps_kill_keep_accounting_exact(train_run):
    run = train_run(
        # A checkpoint every 10 pushes: the PS dies after one exists. Killed before its first
        # checkpoint, its replacement could only be filled by a worker holding a copy, and
        # the random kills may take every such worker first.
        "--epochs", "8", "--batch-size", "4", "--checkpoint-steps", "10",
        "--max-restarts", "100", "--max-task-retries", "20",
    ).start()  # fmt: skip
    # Everything the job must still be running for happens while it is held: a faster job
    # cannot finish under the test.
    with run.held(mid_epoch) as status:
        [ps] = status["ps"]
        os.killpg(ps["pid"], signal.SIGCONT)  # the PS answers; the stopped workers train nothing
        # A process without the job's credentials is turned away by master and PS alike.
        probe = subprocess.run(
            [sys.executable, "-c", UNAUTHENTICATED_PROBE, status["master"], ps["address"]],
            capture_output=True,
            text=True,
            timeout=60,
        )
        # A second master of the same job is turned away while the first one runs.
        second = subprocess.run(run.argv, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    codes = dict(item.split("=") for item in probe.stdout.split())
    assert len(codes) == 7 and set(codes.values()) == {"UNAUTHENTICATED"}, codes
    assert second.returncode == 2, second.stderr
    assert "another master is running the job" in second.stderr

    # Kills at chosen points of the first epoch, of random workers; the PS dies at the second,
    # after its first checkpoint.
    rng = random.Random(3)
    kills = 0
    for version in (8, 16, 24, 32):
        with run.held(lambda s, v=version: mid_epoch(s) and s["model_version"] >= v) as status:
            if version == 16:
                os.kill(status["ps"][0]["pid"], signal.SIGKILL)
            workers = [m for m in status["workers"] if m["state"] == "running" and m["pid"]]
            os.kill(rng.choice(workers)["pid"], signal.SIGKILL)
            kills += 1

    assert run.wait(timeout=300) == 0, run.log()[-3000:]
    summary = run.summary()
    assert records_exact(summary), summary["epochs"]
    assert summary["restarts"]["ps"] == 1
    assert summary["restarts"]["worker"] >= kills
    assert summary["metrics"]["accuracy"] > 0.8
    [restore] = summary["ps_restores"]
    assert restore["versions_lost"] >= 0 and restore["restored_version"] > 0


def test_a_model_definition_changed_in_the_output_is_refused_and_fails_the_job(train_run):
    run = train_run("--epochs", "3").start()
    copy = run.output / "model_def.py"
    with run.held(mid_epoch) as status:
        # Someone with write access to --output puts code of their own into the job.
        copy.write_text("import os\nos.system('touch /tmp/pwned')\n" + copy.read_text())
        for worker in status["workers"]:  # their replacements must load the file
            if worker["state"] == "running":
                os.kill(worker["pid"], signal.SIGKILL)
    assert run.wait() == 1, run.log()[-3000:]
    failed = [line for line in run.log().splitlines() if "the job failed" in line]
    assert len(failed) == 1, run.log()[-3000:]
    assert f"the model definition {copy}: its SHA-256 is" in failed[0]
    assert "as when the job started: it was changed since" in failed[0]
    assert run.status()["phase"] == "failed"
    # The replacement refused the file in one line and ran none of it.
    replacement = next(
        name
        for name in sorted(os.listdir(run.output / "backend" / "logs"))
        if name.startswith("worker-") and name[:-4] not in run.member_pids(status)
    )[:-4]
    refusals = [line for line in run.instance_log(replacement).splitlines() if "SHA-256" in line]
    assert len(refusals) == 1 and refusals[0].endswith("; exiting"), refusals

    # A second job on the same output, its state elsewhere: refused before it writes there.
    before = {p: p.stat().st_mtime_ns for p in run.output.rglob("*") if p.is_file()}
    elsewhere = str(run.output.parent / "other-state")
    other = train_run("--epochs", "3", "--state-dir", elsewhere, output=run.output)
    assert other.start().wait() == 2, other.log()[-3000:]
    (line,) = [line for line in other.log().splitlines() if "belongs to another job" in line]
    assert f"{run.output} belongs to another job: train job es-" in line
    assert f"its state in {run.output / 'master-state'}" in line
    assert {p: p.stat().st_mtime_ns for p in run.output.rglob("*") if p.is_file()} == before


def _can_mount_in_a_namespace() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = ["unshare", "--mount", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"]
    return subprocess.run(probe, capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_mount_in_a_namespace(), reason="needs root and unshare --mount")
def test_a_full_disk_under_the_checkpoints_ends_the_job_saying_so(train_run):
    """The checkpoints on a 32 KiB tmpfs (mounted in a namespace of the job's own): the PS
    cannot write one; no worker crashes for it, and the job ends naming the full disk."""
    run = train_run("--epochs", "3", "--checkpoint-steps", "2")
    checkpoints = run.output / "checkpoints"
    checkpoints.mkdir(parents=True)
    mount = 'mount -t tmpfs -o size=32k tmpfs "$0" && exec "$@"'
    run.argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount,
                str(checkpoints), *run.argv]  # fmt: skip
    assert run.start().wait() == 1, run.log()[-3000:]
    failed = [line for line in run.log().splitlines() if "the job failed" in line]
    assert len(failed) == 1, run.log()[-3000:]
    assert failed[0].endswith(
        f"the job failed: ps-0: cannot write a checkpoint in {checkpoints / 'ps-0-of-1'}: "
        "no space left on device"
    )
    assert run.summary()["restarts"]["worker"] == 0  # a full disk is not a worker's fault
    ps_log = run.instance_log("ps-0")
    assert "no space left on device" in ps_log and "Traceback" not in ps_log
    assert not any(checkpoints.iterdir())  # the mount went with the namespace
