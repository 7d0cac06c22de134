"""``elastic-step preprocess --runner beam``: the preprocessing of preprocess.py as Apache Beam
pipelines, which write the same files, byte for byte.

This process reads the header and the first rows (the columns' kinds), makes the runner ready
(beam_runners.py), and runs the passes, each a pipeline of its own (beam_stages.py) whose
steps are beam_steps.py's. The first pass cuts the file into ranges of whole rows
(csv_ranges.py: each chunk counts its quotes in parallel). The output goes into a
temporary directory beside ``output`` that replaces it when the pipeline has succeeded, as
on a single machine. On a remote runner the workers read the input and write the output
themselves, so both must be where they can reach them (``s3://``, ``gs://``), and the
workers need elastic-step installed.

Beam is imported here and only when called: plain ``preprocess`` needs no Beam. Without a
``--runner`` among the Beam options, the pipeline runs on Beam's local FnApiRunner in this
process (DirectRunner would first try Prism, whose binary it downloads).
Tests: tests/unit/test_beam_preprocess.py, tests/e2e/test_beam_training.py, tests/beam/.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

from elastic_step.data import beam_runners, beam_steps, storage, vocabulary
from elastic_step.data.beam_stages import Stages
from elastic_step.data.beam_steps import PIECES, Job, Part
from elastic_step.data.csv_ranges import (
    CHUNK_BYTES,
    ChunkQuotes,
    RowRange,
    chunk_quotes,
    chunk_starts,
    row_ranges,
)
from elastic_step.data.csv_scan import infer_columns, leading_batches
from elastic_step.data.parquet_source import ParquetSource
from elastic_step.data.preprocess import (
    SPLITS,
    MemoryBudget,
    check_arguments,
    describe,
    keras_input_names,
    open_input,
    wrote_line,
)
from elastic_step.data.schema import Schema
from elastic_step.data.vocabulary import VocabularyOptions
from elastic_step.errors import ElasticStepError, InputError

BEAM_MISSING = "--runner beam needs Apache Beam: pip install 'elastic-step[beam]' (or apache-beam)"
#: The runner when the options name none: Beam's local batch runner, in this process.
LOCAL_RUNNER = "FnApiRunner"
_MEMORY = MemoryBudget()
#: What Beam adds to the message of an exception raised in a step.
_STEP_NOTE = re.compile(r" \[while running '[^']*'\]")
_WORKER_INPUT_ERROR = re.compile(r"^elastic_step\.errors\.InputError: (.*)$", re.MULTILINE)


def preprocess_on_beam(
    *,
    input_path: str,
    label: str,
    output: str,
    shards: int = 4,
    validation_fraction: float = 0.2,
    seed: int = 0,
    categorical: Sequence[str] = (),
    label_kind: str = "auto",
    fill_missing: str | None = None,
    one_hot: bool = False,
    vocabulary_options: VocabularyOptions = vocabulary.DEFAULTS,
    beam_options: Sequence[str] = (),
    progress: Callable[[str], None] | None = None,
    memory: MemoryBudget = _MEMORY,
    chunk_bytes: int = CHUNK_BYTES,
) -> Schema:
    """What :func:`elastic_step.data.preprocess.preprocess` does, with the same arguments, as
    a Beam pipeline on the runner that ``beam_options`` (flags of Beam's PipelineOptions,
    such as ``--runner=DataflowRunner``) name. ``chunk_bytes`` is about the bytes of CSV text
    that one step reads at a time. Bad input, and a bad Beam option, raise an
    :class:`InputError` of one line."""
    beam = import_beam()
    options = new_options(beam_options)
    say = progress or (lambda _line: None)
    fill = check_arguments(shards, validation_fraction, label_kind, fill_missing)
    source = open_input(input_path, label, categorical, memory)
    vocabulary_options.check_columns(input_path, source.header, label)
    batches = source.batches()
    try:
        leading = leading_batches(batches)
    finally:
        batches.close()
    found = infer_columns(
        source,
        leading,
        label=label,
        categorical=set(categorical),
        label_kind=label_kind,
        hashed=set(vocabulary_options.hash_buckets),
    )
    names = keras_input_names(found, say)
    runner = runner_name(options)
    say(f"preprocessing {input_path} with Apache Beam on {runner}")
    with storage.atomic_directory(output) as tmp, _beam_logs(runner):
        job = Job(
            source=source,
            found=found,
            # Where a CSV file's rows begin; a gzip file and Parquet are read in other parts.
            data_start=0 if source.gzipped else source.data_offset(),
            label_kind=label_kind,
            fill=fill,
            validation_fraction=validation_fraction,
            shards=shards,
            seed=seed,
            bucket_bytes=memory.bucket_bytes,
            spill_bytes=memory.spill_bytes,
            names=names,
            one_hot=one_hot,
            vocabulary=vocabulary_options,
            out_dir=tmp,
        )
        pieces = storage.join(tmp, PIECES)
        stages = Stages(beam, options, pieces, say=say, output=output, runner=runner)
        _run(stages, job, chunk_bytes, say)
        storage.remove(pieces)
    schema = Schema.load(output)
    say(f"read {sum(schema.records.values())} rows, {len(found.header)} columns from {input_path}")
    say(describe(schema))
    for split in SPLITS:
        say(wrote_line(schema, split))
    say(f"wrote {output}")
    return schema


def import_beam() -> ModuleType:
    """``apache_beam``; an :class:`InputError` saying how to install it when it is missing."""
    # At import, Beam's BigQuery client warns that apitools is missing: nothing here needs it.
    logging.disable(logging.WARNING)
    try:
        import apache_beam
    except ImportError:
        raise InputError(BEAM_MISSING) from None
    finally:
        logging.disable(logging.NOTSET)
    logging.getLogger("apache_beam.runners.common").addFilter(_reported_here)
    return apache_beam


def _reported_here(record: logging.LogRecord) -> bool:
    """Drops Beam's log, with its traceback, of an error that the command reports in one
    line."""
    return not (record.exc_info and isinstance(record.exc_info[1], ElasticStepError))


def new_options(flags: Sequence[str]) -> Any:
    """:func:`pipeline_options`, with a runner that Beam does not know (or lacks a module of)
    as an :class:`InputError`."""
    from apache_beam.runners.runner import create_runner

    options = pipeline_options(flags)
    try:
        create_runner(runner_name(options, full=True))
    except (ValueError, ImportError) as e:
        raise InputError(f"--beam-option: {e}") from None
    return options


def runner_name(options: Any, *, full: bool = False) -> str:
    """The runner that ``options`` name: its class name, or with ``full`` as given."""
    from apache_beam.options.pipeline_options import StandardOptions

    runner = options.view_as(StandardOptions).runner
    return runner if full else runner.rsplit(".", 1)[-1]


def pipeline_options(flags: Sequence[str]) -> Any:
    """Beam's PipelineOptions of ``flags`` (``--name=value``), with :data:`LOCAL_RUNNER`
    unless they name a runner; an :class:`InputError` for a flag that Beam does not know or
    whose value it refuses. The runner is made ready first (beam_runners.py): a short name
    resolved, its module imported (its own options are known only then), Prism's binary
    found."""
    from apache_beam.options.pipeline_options import (
        PipelineOptions,
        PrismRunnerOptions,
        StandardOptions,
    )

    for flag in flags:
        if not flag.startswith("--"):
            raise InputError(
                f"--beam-option {flag}: expected an option of Beam's pipelines, such as "
                "--beam-option=--runner=DataflowRunner"
            )
    options = PipelineOptions(list(flags))
    standard = options.view_as(StandardOptions)
    standard.runner = beam_runners.resolve(standard.runner) or LOCAL_RUNNER
    beam_runners.import_runner_module(standard.runner)
    refused = io.StringIO()
    try:
        # Beam would log the flags it does not know, and drop them; they are errors here.
        with contextlib.redirect_stderr(refused), _quiet("apache_beam.options.pipeline_options"):
            known = options.get_all_options()
            given = options.get_all_options(retain_unknown_options=True)
    except SystemExit:  # argparse refused a value, after printing its usage
        problem = refused.getvalue().strip().splitlines()[-1].partition("error: ")[2]
        raise InputError(f"--beam-option: {problem}") from None
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise InputError(f"--beam-option --{unknown[0]}: Apache Beam has no such option")
    if beam_runners.is_dask(standard.runner):
        beam_runners.one_item_a_task(options)
    if beam_runners.is_prism(standard.runner):
        prism = options.view_as(PrismRunnerOptions)
        prism.prism_location = beam_runners.prism_location(prism.prism_location)
        if not any(flag.startswith("--prism_log_level") for flag in flags):
            prism.prism_log_level = "warn"  # its INFO lines: each job's start and end
        # Beam's start and stop of Prism's process, a WARNING each, the second at exit.
        logging.getLogger("apache_beam.utils.subprocess_server").setLevel(logging.ERROR)
    return options


@contextlib.contextmanager
def _quiet(logger: str, level: int = logging.ERROR) -> Iterator[None]:
    log = logging.getLogger(logger)
    before = log.level
    log.setLevel(level)
    try:
        yield
    finally:
        log.setLevel(before)


@contextlib.contextmanager
def _quiet_beam() -> Iterator[None]:
    """Beam's loggers at WARNING, and the INFO lines that its portable runner logs to the root
    logger (a job's messages, on Prism: "starting job-001[job]")."""

    def from_beam(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or "apache_beam" not in record.pathname

    root = logging.getLogger()
    root.addFilter(from_beam)
    try:
        with _quiet("apache_beam", logging.WARNING):
            yield
    finally:
        root.removeFilter(from_beam)


def _beam_logs(runner: str) -> contextlib.AbstractContextManager:
    """Beam's logs, but for its INFO lines on a local runner: they tell a user nothing (a
    remote runner's say where the job is)."""
    from apache_beam.options.pipeline_options import StandardOptions

    if runner in StandardOptions.LOCAL_RUNNERS:
        return _quiet_beam()
    # The steps' type hints are strings (``from __future__ import annotations``), which Beam
    # reads as Any, saying so at INFO for each.
    return _quiet("apache_beam.typehints", logging.WARNING)


def _run(stages: Stages, job: Job, chunk_bytes: int, say: Callable[[str], None]) -> None:
    """The passes of beam_steps.py, one pipeline each (beam_stages.py), and the schema."""
    try:
        ranges = _ranges(stages, job, chunk_bytes)
        counted = stages.map("count", beam_steps.count_range, ranges, job)
        plan = beam_steps.make_plan(counted, job, say)
        splits = stages.map("split", beam_steps.split_range, ranges, job, plan)
        placed = beam_steps.place(splits, plan)
        encoded = stages.map("encode", beam_steps.encode_range, ranges, job, placed)
        buckets = beam_steps.bucket_blocks(encoded)
        written = stages.map("write", beam_steps.write_bucket, buckets, job, placed)
        shards = stages.map("join", beam_steps.join_shard, beam_steps.by_shard(written), job)
    except InputError as e:
        # Beam adds the step that raised it; the message names the file, line and column.
        raise InputError(_STEP_NOTE.sub("", str(e))) from None
    except Exception as e:
        # Workers in other processes (--direct_running_mode=multi_processing, a remote
        # runner) send back their exception as the text of its traceback.
        found = _WORKER_INPUT_ERROR.search(str(e))
        if found is None:
            raise
        raise InputError(_STEP_NOTE.sub("", found.group(1))) from None
    beam_steps.write_schema(job, placed, encoded, shards)


def _ranges(stages: Stages, job: Job, chunk_bytes: int) -> list[Part]:
    """The parts of the input: Parquet's row groups; a CSV file's ranges of whole rows (a gzip
    file is one; else the chunks' quotes, counted on the workers, say where rows end)."""
    if isinstance(job.source, ParquetSource):
        return list(job.source.parts())
    size = job.source.total_bytes
    if job.source.gzipped:  # no reading from the middle
        return [RowRange(index=0, start=0, end=size)]
    starts = chunk_starts(job.data_start, size, chunk_bytes)
    chunks = list(zip(starts, [*starts[1:], size], strict=True))
    quotes = stages.map("quotes", _quotes, chunks, job.source.path)
    return row_ranges(job.data_start, size, quotes)


def _quotes(chunk: tuple[int, int], path: str) -> ChunkQuotes:
    return chunk_quotes(path, *chunk)
