"""What the master asks a backend to start: one worker's or PS's command and credentials.
Tests: tests/unit/test_kubernetes_pods.py (the pods a dry run plans)."""

from __future__ import annotations

import sys

from elastic_step.backends import Role
from elastic_step.backends.api import LaunchSpec
from elastic_step.master.instances.job_keys import JobKeys

#: What a worker or PS imports first; the local backend loads it once for all of them.
INSTANCE_PRELOAD = (
    "tensorflow",
    "keras",
    "elastic_step.cli",
    "elastic_step.worker.worker",
    "elastic_step.ps.server",
)


def launch_spec(
    role: Role, slot: int, name: str, master_address: str, credentials: dict[str, str]
) -> LaunchSpec:
    """What the backend is asked to start for instance ``name`` of ``role`` in ``slot``, with
    ``credentials`` (its secret environment: see ``JobKeys.instance_env``)."""
    if role is Role.PS:
        args = ["ps", "--master", master_address, "--shard", str(slot), "--name", name]
    else:
        args = ["worker", "--master", master_address, "--name", name]
    return LaunchSpec(
        name,
        role,
        slot,
        [sys.executable, "-m", "elastic_step", *args],
        secret_env=credentials,
        preload=INSTANCE_PRELOAD,
    )


def planned_specs(*, ps: int, workers: int, master_address: str, keys: JobKeys) -> list[LaunchSpec]:
    """The instances a new job starts with: every PS shard, then the first ``workers``
    workers, under the names the instance manager gives them (for ``--dry-run``)."""
    names = [(Role.PS, s, f"ps-{s}") for s in range(ps)]
    names += [(Role.WORKER, s, f"worker-{s}") for s in range(workers)]
    return [
        launch_spec(role, slot, name, master_address, keys.instance_env(name))
        for role, slot, name in names
    ]
