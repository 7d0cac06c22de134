"""bench/data_order.py's epochs: the orders in which model.fit and an elastic job's tasks feed
a data set's records, which the study trains in; tests/e2e/test_quality_bench.py runs it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from data_order import batches_of_epoch


def test_each_order_trains_every_record_once_an_epoch_and_tasks_keep_to_their_range() -> None:
    shards, batch, per_task = [37, 40], 8, 16
    for order in ("fit", "ranges", "shards", "split"):
        first = batches_of_epoch(order, shards, batch, per_task, np.random.default_rng(0))
        second = batches_of_epoch(order, shards, batch, per_task, np.random.default_rng(1))
        assert first != second, order  # a new order each epoch
        for batches in (first, second):
            assert all(len(positions) <= batch for _, positions in batches), order
            if order in ("fit", "split"):
                seen = sorted(p for _, positions in batches for p in positions)
                assert seen == list(range(sum(shards))), order
                continue
            for shard, records in enumerate(shards):
                seen = sorted(p for s, positions in batches if s == shard for p in positions)
                assert seen == list(range(records)), (order, shard)
        if order == "split":
            # The master's permuted tasks go out in position order: the short one last.
            assert all(len(positions) == batch for _, positions in first[:-1])
            assert len(first[-1][1]) == sum(shards) % batch
        if order == "ranges":
            # A task's records stay within its range of the shard, so a batch does too.
            for _, positions in first:
                assert len({p // per_task for p in positions}) == 1, positions
