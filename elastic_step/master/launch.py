"""What the master asks a backend to start: one worker's or PS's command and credentials.
Tests: tests/unit/test_kubernetes_pods.py (the pods a dry run plans)."""

from __future__ import annotations

import sys

from elastic_step.backends import Role
from elastic_step.backends.api import LaunchSpec
from elastic_step.rpc import auth


def launch_spec(role: Role, slot: int, name: str, master_address: str, secret: str) -> LaunchSpec:
    """What the backend is asked to start for instance ``name`` of ``role`` in ``slot``."""
    if role is Role.PS:
        args = ["ps", "--master", master_address, "--shard", str(slot), "--name", name]
        # A PS checks every caller's token, so it holds the secret.
        credentials = {auth.SECRET_ENV: secret}
    else:
        args = ["worker", "--master", master_address, "--name", name]
        credentials = {auth.TOKEN_ENV: auth.token_for(secret, name)}
    return LaunchSpec(
        name,
        role,
        slot,
        [sys.executable, "-m", "elastic_step", *args],
        secret_env=credentials,
    )


def planned_specs(*, ps: int, workers: int, master_address: str, secret: str) -> list[LaunchSpec]:
    """The instances a new job starts with: every PS shard, then the first ``workers``
    workers, under the names the instance manager gives them (for ``--dry-run``)."""
    specs = [launch_spec(Role.PS, s, f"ps-{s}", master_address, secret) for s in range(ps)]
    specs += [
        launch_spec(Role.WORKER, s, f"worker-{s}", master_address, secret) for s in range(workers)
    ]
    return specs
