"""The Beam preprocessing as a few pipelines run one after the other, each a function mapped
over small items (ranges of the file, buckets, shards) on the runner's workers.

Why not one pipeline with side inputs, as Beam's examples do: each pass needs what the pass
before learned from the whole file (the counts, the split plan, where each range's rows go),
and Beam's Dask runner computes a side input again, from the start of the pipeline, in every
task that reads it: the file was parsed once per task, and a range's records written again
while other tasks read them. So this process runs each pass as its own pipeline and keeps what
the passes learn, and a pass gets it as an argument of its function. A pass's function, items
and arguments are written, pickled, under the output's temporary directory, which the workers
reach (a worker that does not says so in one line); each item's result is written there too,
and read back here. What comes back is small (counts, file places, shard entries); the
records themselves go from pass to pass through files (spill.py).

Every runner runs the same pipelines: one ``Create`` of the items' numbers, a ``Reshuffle``
that spreads them over the workers, and the function. On Dask, where ``Create`` would put up to
128 items in one task, each item is its own task unless ``--dask_npartitions`` or
``--dask_partition_size`` says otherwise (beam_preprocess.pipeline_options).
Tests: tests/unit/test_beam_preprocess.py, tests/beam/.
"""

from __future__ import annotations

import functools
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any

from elastic_step.data import storage
from elastic_step.errors import InputError

#: Where each pass's input and results wait to be read, under the output's temporary directory.
RESULTS = "results"
#: A pass's function, items and arguments, pickled: the pipeline itself holds only the items'
#: numbers, so its size, which a runner keeps for each job (and Dataflow caps), stays the same
#: whatever the data.
INPUT = "input.pickle"


@dataclass(frozen=True)
class Stages:
    """Runs passes on one runner; ``pieces`` is the directory, reached by every worker, where
    their results are written. ``say`` reports each pass (its items and seconds); ``output``
    and ``runner`` name the job in an error."""

    beam: Any
    options: Any
    pieces: str
    _: KW_ONLY
    say: Callable[[str], None]
    output: str
    runner: str

    def map(self, name: str, fn: Callable, items: Sequence, *args: Any) -> list:
        """``[fn(item, *args) for item in items]``, computed on the runner's workers, in the
        order of ``items``."""
        if not items:
            return []
        beam = self.beam
        out = storage.join(self.pieces, RESULTS, name)
        given = storage.join(out, INPUT)
        started = time.monotonic()
        storage.write_bytes_atomic(
            given, pickle.dumps((fn, list(items), args), protocol=pickle.HIGHEST_PROTOCOL)
        )
        pipeline = beam.Pipeline(options=self.options)
        _ = (
            pipeline
            | f"{name}: items" >> beam.Create(list(range(len(items))))
            | f"{name}: spread" >> beam.Reshuffle()
            | name >> beam.Map(_compute, given, out)
        )
        _run(pipeline)
        results = [self._load(storage.join(out, _result_name(i)), name) for i in range(len(items))]
        self.say(f"{name}: {len(items)} items in {time.monotonic() - started:.1f}s")
        return results

    def _load(self, path: str, name: str) -> Any:
        if not storage.exists(path):
            raise InputError(
                f"{self.output}: the pipeline on {self.runner} wrote no result of '{name}' "
                "where this process reads it; its workers must reach --input and --output "
                "(URIs such as s3:// or gs://)"
            )
        return pickle.loads(storage.read_bytes(path))


@functools.lru_cache(maxsize=1)
def _inputs(path: str) -> tuple[Callable, list, tuple]:
    """A pass's function, items and arguments, read once per worker process and pass."""
    if not storage.exists(path):
        raise InputError(
            f"{path}: not found where the pipeline's workers run; they must reach --input and "
            "--output (URIs such as s3:// or gs://)"
        )
    return pickle.loads(storage.read_bytes(path))


def _compute(index: int, given: str, out: str) -> None:
    fn, items, args = _inputs(given)
    storage.write_bytes_atomic(
        storage.join(out, _result_name(index)),
        pickle.dumps(fn(items[index], *args), protocol=pickle.HIGHEST_PROTOCOL),
    )


def _result_name(index: int) -> str:
    return f"{index:06d}.pickle"


def _run(pipeline: Any) -> None:
    """Runs ``pipeline`` to its end; a Dask runner's client is closed after it (Beam leaves
    it open, one connection more for every pass)."""
    result = pipeline.run()
    try:
        result.wait_until_finish()
    finally:
        client = getattr(result, "client", None)
        if client is not None:
            client.close()
