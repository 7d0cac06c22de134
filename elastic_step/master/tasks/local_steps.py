"""How many local steps a worker runs between two pushes, when the master chooses
(``--local-steps 0``, the default).

A window of K local steps makes a worker as fast as ``model.fit``: one round trip to the PS per
K batches instead of per batch. But the PS adds each worker's change to a model that the other
workers' changes have moved on from, and with W workers a worker's copy is up to (W - 1) x K
steps behind. Where that is a large share of an epoch the model suffers: on a small, noisy
problem (bench/quality.py's ``noisy``: 60 steps an epoch, Adam(0.02)) K = 16 with 4 workers
lost 5 points of accuracy against ``fit`` and one run in four collapsed, while K = 1 and K = 4
held ``fit``'s accuracy. On a job with hundreds of steps an epoch K = 16 costs nothing
measurable (bench/README.md, "Quality benchmark").

So the master takes the largest K, up to :data:`MAX_LOCAL_STEPS`, at which every worker still
pushes :data:`PUSHES_PER_WORKER_EPOCH` times an epoch: the copy a worker trains on is then
never more than 1/8 of an epoch's steps behind the PS's model. With one worker the local steps
are exactly ``fit``'s steps (the outer optimizer adds the change as it is). A K given on the
command line is used as given: ``--local-steps 16`` is the throughput-first setting.

The choice is made once, when the job starts (the PS's optimizer depends on it), and a
resumed job keeps it (see ``JobRecord.local_steps``). Tests: tests/unit/test_master_local_steps.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The master's choice never goes above this: past 16 the throughput bench gained nothing.
MAX_LOCAL_STEPS = 16
#: Pushes each worker makes in an epoch, at the least, under the master's choice.
PUSHES_PER_WORKER_EPOCH = 8
#: The value of ``--local-steps`` that leaves the choice to the master.
CHOSEN_BY_MASTER = 0


@dataclass(frozen=True)
class LocalSteps:
    """The steps a worker runs between pushes, and why (for the master's log)."""

    steps: int
    reason: str


def choose_local_steps(
    requested: int, *, train_records: int, batch_size: int, workers: int
) -> LocalSteps:
    """``requested`` when it is a number of steps (>= 1); for :data:`CHOSEN_BY_MASTER` the
    largest K <= :data:`MAX_LOCAL_STEPS` at which each of ``workers`` workers (the most the job
    may have) pushes at least :data:`PUSHES_PER_WORKER_EPOCH` times in an epoch of
    ``train_records`` records in batches of ``batch_size``."""
    if requested < 0:
        raise ValueError(f"local steps must be >= 0 (0: chosen by the master), got {requested}")
    if requested != CHOSEN_BY_MASTER:
        return LocalSteps(requested, "as given by --local-steps")
    steps_per_epoch = math.ceil(train_records / batch_size) if train_records else 0
    per_worker = steps_per_epoch // (PUSHES_PER_WORKER_EPOCH * max(1, workers))
    steps = max(1, min(MAX_LOCAL_STEPS, per_worker))
    reason = (
        f"chosen by the master: {steps_per_epoch} steps an epoch over {workers} "
        f"worker{'s' * (workers != 1)}, so that each pushes at least "
        f"{PUSHES_PER_WORKER_EPOCH} times an epoch (at most {MAX_LOCAL_STEPS}; "
        "--local-steps K sets it)"
    )
    return LocalSteps(steps, reason)
