"""The engine under hostile conditions: chaos (random worker kills and a PS kill) keeps
accounting exact, a model definition changed in the output is refused, and a full disk under
the checkpoints ends the job saying so. (Split from test_hardening.py so that `make test` can
run the two files side by side.)"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import mid_epoch, records_exact

pytestmark = pytest.mark.e2e

# Run by the chaos test: a process without the job's credentials calls master and PS.
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
