"""How many records a task holds, when the master chooses (``--records-per-task 0``, the
default).

A task is a range of one shard (on a small split, of the split's permutation for the epoch:
below), and its records are trained in one go: shuffled among themselves, but never mixed with
another task's. So the model a job ends with has just trained on its epoch's last task. Under
``model.fit`` the last steps are a random share of the data, another one for every seed; a job
whose epoch is a few large tasks ends on one of a few fixed blocks instead. On scikit-learn's
diabetes (354 training records in 2 shards, bench/quality.py) tasks of 512 records made each
epoch two tasks, a shard each: which shard came last decided the validation loss, and its
spread over seeds was 3.6 times ``fit``'s with one worker. Tasks of 16 records brought it
within twice ``fit``'s.

A window of local steps never spans tasks (worker/windows.py), so a task shorter than K
batches cuts the windows short: at batch 512, tasks of 512 records made ``--local-steps 16``
(the throughput-first setting) one step a window. And a task's first window pulls its rows in
a round trip of its own, where the next windows' rows come with the push before them. So where
``--local-steps K`` (K > 1) is given, a task may hold :data:`WINDOW_BATCHES` batches, or K if
that is more: on bench/scale.py's CTR job with K = 4, tasks of 16 batches trained 7 % faster
than tasks of 4. Where the master chooses K, tasks keep the default size: on that job windows
of the master's K = 16 cost 0.009 of AUC, and of 4, 0.003 (bench/README.md, "A recommendation
job at scale").

So the master makes tasks :data:`DEFAULT_RECORDS_PER_TASK` records long, or the batches above
if ``--local-steps K`` is given and that is longer, but smaller where an epoch would have
fewer than :data:`MIN_TASKS_PER_EPOCH` of them: a whole number of batches, so that only a
shard's end leaves a short batch. Past that size a task's overhead (a call to the master, a
read, a pull) is little beside its training; below it, a small data set trains in seconds
whatever the tasks cost. Evaluation tasks take the training tasks' size; prediction tasks
:data:`DEFAULT_RECORDS_PER_TASK`. A size given on the command line is used as given.
The choice depends only on the data, the batch size and ``--local-steps``, which a resumed
job keeps, so a restarted master makes the same tasks.

Small tasks of fixed ranges still train the same few batches every epoch, only in another
order, where ``fit`` draws new ones: on diabetes, with no PS and no asynchrony at all
(bench/data_order.py, 20 seeds), that order alone cost 2 % of validation MSE against
``fit``'s. So on a small training split, at most :data:`PERMUTED_SPLIT_RECORDS` records (the
splits on which the master makes tasks smaller than :data:`DEFAULT_RECORDS_PER_TASK`) and
:data:`PERMUTED_SPLIT_BYTES` bytes, training tasks are *permuted*
(:func:`permuted_training_tasks`): each epoch the split, its shards joined, is permuted anew,
and a task is a range of that permutation (worker/task_records.py), as ``fit``'s batches are
ranges of its epoch's shuffle. A worker then reads the whole split once and keeps it. The
task manager hands them out in position order, so that the one short task, at the split's
end, goes last in its epoch, as ``fit``'s short batch does.
Permuting each shard on its own instead leaves a task of a record or two at every shard's
end; on diabetes that made one seed's MSE 0.67-0.68 where the others' were 0.56-0.60. With
permuted tasks diabetes' mean MSE over 20 seeds is 1.008x ``fit``'s, from 1.026x with ranges
(bench/README.md, "Permuted tasks on small splits").
Tests: tests/unit/test_master_task_size.py.
"""

from __future__ import annotations

#: The value of ``--records-per-task`` that leaves the choice to the master.
CHOSEN_BY_MASTER = 0
#: Records per task when the master chooses, at most.
DEFAULT_RECORDS_PER_TASK = 512
#: Training tasks an epoch has, at the least, when the master chooses (data allowing).
MIN_TASKS_PER_EPOCH = 32
#: Batches a task may hold with ``--local-steps K`` given (K > 1), or K if that is more.
WINDOW_BATCHES = 16
#: Training splits of at most this many records, and PERMUTED_SPLIT_BYTES, get permuted tasks.
PERMUTED_SPLIT_RECORDS = MIN_TASKS_PER_EPOCH * DEFAULT_RECORDS_PER_TASK
#: A worker keeps a permuted split whole in memory: at most this many bytes of shards.
PERMUTED_SPLIT_BYTES = 256 << 20


def training_records_per_task(
    requested: int, *, train_records: int, batch_size: int, local_steps: int = 0
) -> int:
    """``requested`` when it is a number of records (>= 1); for :data:`CHOSEN_BY_MASTER` the
    largest whole number of batches of ``batch_size``, at least one, at most
    :data:`DEFAULT_RECORDS_PER_TASK` records, or with ``local_steps`` K > 1 (as given; 0: the
    master chooses them) :data:`WINDOW_BATCHES` or K batches, whichever is most, that cuts
    ``train_records`` into :data:`MIN_TASKS_PER_EPOCH` tasks or more."""
    if requested < 0:
        raise ValueError(
            f"records per task must be >= 0 (0: chosen by the master), got {requested}"
        )
    if requested != CHOSEN_BY_MASTER:
        return requested
    most = max(1, DEFAULT_RECORDS_PER_TASK // batch_size, window_batches(local_steps))
    batches = max(1, train_records // (MIN_TASKS_PER_EPOCH * batch_size))
    return min(most, batches) * batch_size


def window_batches(local_steps: int) -> int:
    """The batches a master-sized task may hold for its windows of ``local_steps`` (as
    given; 0: the master chooses): :data:`WINDOW_BATCHES` or K for K > 1, else 1."""
    return max(WINDOW_BATCHES, local_steps) if local_steps > 1 else 1


def permuted_training_tasks(train_records: int, train_bytes: int) -> bool:
    """Whether a training split of ``train_records`` records in shards of ``train_bytes``
    bytes gets permuted tasks: at most :data:`PERMUTED_SPLIT_RECORDS` and
    :data:`PERMUTED_SPLIT_BYTES`."""
    return train_records <= PERMUTED_SPLIT_RECORDS and train_bytes <= PERMUTED_SPLIT_BYTES


def prediction_records_per_task(requested: int) -> int:
    """Prediction tasks: ``requested``, or :data:`DEFAULT_RECORDS_PER_TASK`."""
    return requested or DEFAULT_RECORDS_PER_TASK
