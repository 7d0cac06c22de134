"""One input pipeline per mode for the whole life of a worker.

Starting a ``tf.data`` iterator instantiates the feed's graph: about 250 ms for a 64-column
``parse_example`` on 2 cores, as much as 50 training steps of a small model. Building one
per task would cost that on every task, so a worker builds one pipeline per mode, feeds it
each task's records through a queue, and counts examples to know where a task ends. That is
why a feed must map every record to exactly one example (as ``dataset.map`` does).

A task's records may be queued (:meth:`BatchStream.put`) before the task before it has
run: the pipeline's prefetch then parses them while that task trains. The batches are taken
either one by one in Python (:meth:`BatchStream.run`) or, by a compiled loop, straight from
:attr:`BatchStream.iterator` (a window of steps in one call, as ``model.fit`` does); then each
batch must be one queued batch of records, as a feed that maps batches does.
Tests: none direct; exercised by every end-to-end run (tests/e2e/).
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator

from elastic_step.data.feed import apply_feed
from elastic_step.model.definition import batch_size_of
from elastic_step.user_errors import plain_message


class FeedContractError(Exception):
    """The feed produced more examples than records, or failed; the message says which."""


class BatchStream:
    def __init__(self, feed: Callable | None, mode: str, schema, batch_size: int) -> None:
        import tensorflow as tf

        self._batch_size = batch_size
        self._queue: queue.Queue = queue.Queue()
        self.broken = False

        def batches():
            while (batch := self._queue.get()) is not None:
                yield batch

        source = tf.data.Dataset.from_generator(
            batches, output_signature=tf.TensorSpec([None], tf.string)
        )
        try:
            dataset = apply_feed(feed, source, mode, schema)
        except TypeError as e:
            raise FeedContractError(str(e)) from e
        self.iterator = iter(dataset)

    def put(self, records: list[bytes]) -> int:
        """Queues a task's records, a batch at a time; returns the number of batches. Safe
        from any thread."""
        import numpy as np

        batches = 0
        for start in range(0, len(records), self._batch_size):
            self._queue.put(np.array(records[start : start + self._batch_size], dtype=object))
            batches += 1
        return batches

    def run(self, records: int) -> Iterator[tuple]:
        """Yields the ``(features, labels)`` batches of the oldest task queued (:meth:`put`),
        which has ``records`` records.

        If the caller stops early, the rest of the task's batches are drained, so the next
        task starts clean. After a feed error the stream is ``broken`` and must be rebuilt.
        """
        remaining = records
        try:
            while remaining > 0:
                try:
                    features, labels = next(self.iterator)
                except Exception as e:
                    self.broken = True
                    raise FeedContractError(
                        f"the feed failed: {type(e).__name__}: {plain_message(e)}"
                    ) from e
                count = batch_size_of(labels, features)
                if count > remaining:
                    self.broken = True
                    raise FeedContractError(
                        "the feed produced more examples than records; it must map every "
                        "record to exactly one example"
                    )
                remaining -= count
                yield features, labels
        finally:
            try:
                while remaining > 0 and not self.broken:
                    features, labels = next(self.iterator)
                    remaining -= batch_size_of(labels, features)
            except Exception:
                self.broken = True

    def close(self) -> None:
        self._queue.put(None)
