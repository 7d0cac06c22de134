"""One job per ``--output``: ``job-owner.json`` in it names the job that writes there.

The state store's lease keeps two masters of one job apart, but it guards the state, not
the output: two jobs with their state in different places (another ``--state-dir``,
another ``--job-name`` on the cluster) would write the same checkpoints, model and
summary. So a master, once it holds its lease, claims the output: it writes its job's
name, where the job's state lives, and its fencing token. A master of the same job (a
resume, the next master after a restart) takes the claim over with its newer token; any
other job is refused (exit 2) before it writes anything there. (The token is a record, not
a check: the lease fences a stale master.) A marker that cannot be read is set aside, never
trusted and never deleted.
Tests: tests/unit/test_output_owner.py; a second job on an output in
tests/e2e/test_hostile_conditions.py.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass

from elastic_step.data import storage
from elastic_step.errors import InputError
from elastic_step.output_layout import OutputLayout

log = logging.getLogger("elastic_step.master")

MARKER = "job-owner.json"


class OutputTakenError(InputError):
    """The output belongs to another job."""


@dataclass(frozen=True, kw_only=True)
class OutputOwner:
    """Who writes an output: a job (its name and where its state lives) and the fencing
    token of the master that claimed it last."""

    job: str
    state: str
    command: str
    token: int
    master: str

    def same_job(self, other: OutputOwner) -> bool:
        return (self.job, self.state, self.command) == (other.job, other.state, other.command)


def marker_path(output: str) -> str:
    return storage.join(output, MARKER)


def read_owner(output: str) -> OutputOwner | None:
    """The output's owner as its marker says; None when there is no marker, or when the
    marker is unreadable (then it is set aside)."""
    path = marker_path(output)
    if not storage.exists(path):
        return None
    try:
        data = json.loads(storage.read_text(path))
        return OutputOwner(
            job=str(data["job"]),
            state=str(data["state"]),
            command=str(data["command"]),
            token=int(data["token"]),
            master=str(data["master"]),
        )
    except (ValueError, TypeError, KeyError) as e:
        storage.set_aside(path, f"not a job-owner marker ({type(e).__name__}: {e})")
        return None


def claim_output(output: str, claimant: OutputOwner) -> None:
    """Makes ``claimant`` the owner of ``output``; raises :class:`OutputTakenError` naming
    the owner when the output belongs to another job."""
    owner = read_owner(output)
    if owner is not None and not owner.same_job(claimant):
        raise OutputTakenError(
            f"{output} belongs to another job: {owner.command} job {owner.job} with its "
            f"state in {owner.state} (see {marker_path(output)}); this {claimant.command} "
            f"job is {claimant.job} with its state in {claimant.state}: give it its own "
            "--output"
        )
    storage.makedirs(output)
    storage.write_text_atomic(marker_path(output), json.dumps(asdict(claimant), indent=1))
    if owner is None:
        log.info("claimed %s for job %s (fencing token %d)", output, claimant.job, claimant.token)


def refuse_legacy_output(paths: OutputLayout) -> None:
    """Refuses an output that holds a job of a version before the journal."""
    if storage.exists(paths.legacy_state_file):
        raise InputError(
            f"{paths.root} holds a job of an older elastic-step version, which cannot be "
            "resumed; use a new --output"
        )
