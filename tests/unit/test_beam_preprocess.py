"""`preprocess --runner beam` on Beam's local runner writes what the single-machine path
writes, byte for byte: the same shards (the same records, in the same order, so the same
split), the same indexes and the same schema.json. Also: the cuts of a CSV into ranges of
whole rows, errors that name the line as the single-machine path does, and one line for a
bad Beam option or a missing Beam."""

from __future__ import annotations

import gzip
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from file_trees import tree

pytest.importorskip("apache_beam")

from elastic_step.cli import command_parser, main
from elastic_step.components.parameters import arguments
from elastic_step.data import beam_runners, beam_stages, storage
from elastic_step.data.beam_preprocess import BEAM_MISSING, pipeline_options, preprocess_on_beam
from elastic_step.data.csv_ranges import (
    chunk_quotes,
    chunk_starts,
    row_ranges,
)
from elastic_step.data.csv_source import CsvSource
from elastic_step.data.preprocess import MemoryBudget, preprocess
from elastic_step.data.schema import Schema
from elastic_step.data.tfrecord import read_records
from elastic_step.errors import InputError

# Several buckets per shard: the Beam path writes them as pieces and joins them.
TINY = MemoryBudget(block_bytes=512, batch_bytes=2048, spill_bytes=4096, bucket_bytes=4096)
# A few hundred bytes of CSV per range: a 300-row file is read as 9 to 16 ranges.
SMALL_CHUNKS = 600


def write_csv(path: Path, *, rows: int = 300, quoted: bool = False, label: str = "text") -> Path:
    """Numeric columns with empty cells (one named as Keras refuses), a categorical column
    with empty cells, and a 3-class label sorted in the file (a worst case for the split):
    ``label`` ``text`` (a, b, c), ``integer`` (1, 2, 3, some spelled 2.0 or 03) or
    ``number``. ``quoted``: categorical values with a comma, ``""`` and a line end inside
    quotes, and CRLF line ends."""
    rng = np.random.default_rng(7)
    regions = ['"north, east"', '"south\nwest"', '"the ""centre"""'] if quoted else ["n", "s"]
    lines = ["fixed acidity,density,region,cultivar"]
    for i in range(rows):
        acidity = "" if i % 11 == 0 else f"{rng.normal(8, 1.5):.3f}"
        # Over many magnitudes: the statistics' shift (its first train value) shows.
        density = "" if i % 17 == 3 else f"{rng.lognormal(0, 3):.6g}"
        region = "" if i % 13 == 5 else regions[i % len(regions)]
        kind = i * 3 // rows
        cultivar = {
            "text": "abc"[kind],
            "integer": ["1", "2.0", "03"][kind] if i % 2 else str(kind + 1),
            "number": f"{kind + rng.normal():.4f}",
        }[label]
        lines.append(f"{acidity},{density},{region},{cultivar}")
    end = "\r\n" if quoted else "\n"
    path.write_bytes((end.join(lines) + end).encode())
    return path


def object_tree(uri: str) -> dict[str, bytes]:
    """:func:`tree` of a directory on an object store."""
    files = {}
    for name in storage.listdir(uri):
        path = storage.join(uri, name)
        if storage.isdir(path):
            files.update({f"{name}/{k}": v for k, v in object_tree(path).items()})
        else:
            files[name] = storage.read_bytes(path)
    return files


def records_by_shard(out: Path) -> dict[str, list[bytes]]:
    """The records of each shard (by its path in ``out``), in order."""
    schema = Schema.load(str(out))
    return {
        str(Path(path).relative_to(out)): read_records(path, 0, n)
        for split in ("train", "validation")
        for path, n in schema.shard_paths(str(out), split)
    }


def test_the_command_writes_the_same_files_on_both_runners(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`elastic-step preprocess` and `preprocess --runner beam`, on numeric, categorical and
    empty cells with --fill-missing mean: the same files, and the same account of them."""
    caplog.set_level(logging.INFO, logger="elastic_step")
    csv = write_csv(tmp_path / "wine.csv")
    common = ["--input", str(csv), "--label", "cultivar", "--fill-missing", "mean",
              "--shards", "3", "--seed", "5"]  # fmt: skip
    local, beam = tmp_path / "local", tmp_path / "beam"
    said = {}
    for out, runner in ((local, "local"), (beam, "beam")):
        caplog.clear()
        assert main(["preprocess", *common, "--output", str(out), "--runner", runner]) == 0
        said[runner] = [r.getMessage() for r in caplog.records if r.name == "elastic_step"]

    assert tree(beam) == tree(local)
    assert records_by_shard(beam) == records_by_shard(local)
    schema = Schema.load(str(beam))
    assert schema.records == {"train": 240, "validation": 60}
    assert [len(shards) for shards in schema.splits.values()] == [3, 3]
    assert sum(len(records) for records in records_by_shard(beam).values()) == 300
    acidity, _, region = schema.columns
    assert acidity.input_name == "fixed_acidity" and acidity.fill == acidity.mean
    assert region.kind == "categorical" and "" in schema.vocabulary(region)
    assert f"preprocessing {csv} with Apache Beam on FnApiRunner" in said["beam"]
    # columns: ..., wrote train: ..., wrote validation: ...
    assert said["beam"][-4:-1] == said["local"][-4:-1]
    assert said["beam"][-3] == "wrote train: 240 records in 3 shards"
    for line in (f"read 300 rows, 4 columns from {csv}", "Keras input names: 'fixed acidity' "
                 "-> 'fixed_acidity'"):  # fmt: skip
        assert line in said["beam"] and line in said["local"]


@pytest.mark.parametrize(
    "case",
    [
        "ranges",
        "integer classes",
        "numeric label",
        "tiny memory",
        "quoted values spanning lines",
        "gzip",
        "object store",
    ],
)
def test_beam_writes_what_the_single_machine_path_writes(
    case: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Read as many ranges, whose rows must be numbered, split and dealt as in one
    pass, the output is the same, byte for byte."""
    label = {"integer classes": "integer", "numeric label": "number"}.get(case, "text")
    csv = write_csv(
        tmp_path / "wine.csv", quoted=case == "quoted values spanning lines", label=label
    )
    common = {"label": "cultivar", "fill_missing": "mean", "seed": 1, "shards": 3}
    if case == "tiny memory":
        common.update(memory=TINY, fill_missing="zero", shards=2)
    local = tmp_path / "local"
    preprocess(input_path=str(csv), output=str(local), **common)
    source, out = str(csv), str(tmp_path / "beam")
    if case == "gzip":
        source = str(tmp_path / "data.csv")  # gzip, whatever its name
        Path(source).write_bytes(gzip.compress(csv.read_bytes()))
    if case == "object store":
        bucket = request.getfixturevalue("s3_env").new_bucket()
        source, out = f"s3://{bucket}/in/wine.csv", f"s3://{bucket}/data"
        storage.write_bytes_atomic(source, csv.read_bytes())

    schema = preprocess_on_beam(input_path=source, output=out, chunk_bytes=SMALL_CHUNKS, **common)

    expected = {"number": None, "integer": ["1", "2", "3"], "text": ["a", "b", "c"]}[label]
    assert schema.label_vocabulary == expected
    written = object_tree(out) if case == "object store" else tree(Path(out))
    assert written == tree(local)
    assert schema == Schema.load(str(local))


def test_an_error_names_the_line_as_the_single_machine_path_does(tmp_path: Path) -> None:
    """A bad value far into the file, in a range that does not know its first row's number
    until it must name the line."""
    lines = ["x,c,label"] + [f"{i * 0.5},{'ab'[i % 2]},{i % 3}" for i in range(300)]
    lines[251] = "abc,a,1"
    csv = tmp_path / "bad.csv"
    csv.write_text("\n".join(lines) + "\n")
    messages = []
    for run in (preprocess, lambda **kw: preprocess_on_beam(chunk_bytes=SMALL_CHUNKS, **kw)):
        with pytest.raises(InputError) as error:
            run(input_path=str(csv), label="label", output=str(tmp_path / "out"))
        messages.append(str(error.value))
    assert messages[0] == messages[1]
    assert messages[1].startswith(f"{csv}: line 252: column 'x' has non-numeric value 'abc'")
    assert not (tmp_path / "out").exists()


def test_a_pipeline_that_wrote_elsewhere_leaves_the_old_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Remote workers given a local --output write on their own disks: the command says so,
    and the output that was there stays."""
    csv = write_csv(tmp_path / "wine.csv", rows=20)
    out = tmp_path / "out"
    out.mkdir()
    (out / "schema.json").write_text("{}")
    # The workers write their results on their own disks: none comes back.
    monkeypatch.setattr(beam_stages, "_compute", lambda *args: None)
    with pytest.raises(InputError, match=r"wrote no result of 'quotes' where this process reads"):
        preprocess_on_beam(
            input_path=str(csv), label="cultivar", output=str(out), fill_missing="mean"
        )
    assert tree(out) == {"schema.json": b"{}"}


def test_a_worker_that_cannot_read_a_pass_says_which_file(tmp_path: Path) -> None:
    """A pass's input is written under --output; a worker elsewhere does not find it."""
    given = str(tmp_path / "elsewhere" / "input.pickle")
    with pytest.raises(InputError, match=r"input.pickle: not found where the pipeline's work"):
        beam_stages._compute(0, given, str(tmp_path / "results"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--beam-option=--no_such_option=1"], "--beam-option --no_such_option: Apache Beam "),
        (["--beam-option=--direct_num_workers=two"], "invalid int value: 'two'"),
        (["--beam-option=--runner=NoSuchRunner"], "Unexpected pipeline runner: NoSuchRunner"),
        (["--beam-option=runner"], "--beam-option runner: expected an option of Beam's"),
        # A runner's own options are known once its module is; others are still refused.
        (
            ["--beam-option=--runner=DaskRunner", "--beam-option=--dask_no_such=1"],
            "--beam-option --dask_no_such: Apache Beam has no such option",
        ),
        (
            ["--beam-option=--runner=PrismRunner", "--beam-option=--prism_location=/no/prism"],
            "--beam-option --prism_location=/no/prism: no such file",
        ),
    ],
)
def test_a_wrong_beam_option_is_one_line_and_exit_2(
    options: list[str], message: str, tmp_path: Path, capsys
) -> None:
    csv = write_csv(tmp_path / "wine.csv", rows=20)
    argv = ["preprocess", "--input", str(csv), "--label", "cultivar", "--fill-missing", "mean",
            "--output", str(tmp_path / "out"), "--runner", "beam", *options]  # fmt: skip
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("elastic-step: error: --beam-option") and message in line
    assert not (tmp_path / "out").exists()


def test_runners_are_made_ready_before_their_options_are_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dask's short name and options; on Dask each item a task unless the options partition;
    Prism's binary where `make prism` builds it, never downloaded."""
    from apache_beam.options.pipeline_options import PrismRunnerOptions, StandardOptions
    from apache_beam.runners.dask.dask_runner import DaskOptions

    dask_path = "apache_beam.runners.dask.dask_runner.DaskRunner"
    for name in ("DaskRunner", "dask", dask_path):
        options = pipeline_options([f"--runner={name}", "--dask_client_address=127.0.0.1:1"])
        assert options.view_as(StandardOptions).runner == dask_path
        assert options.view_as(DaskOptions).address == "127.0.0.1:1"
        assert options.view_as(DaskOptions).partition_size == 1
    given = pipeline_options(["--runner=DaskRunner", "--dask_npartitions=3"])
    assert given.view_as(DaskOptions).partition_size is None
    assert given.view_as(DaskOptions).npartitions == 3

    prism = tmp_path / "prism"
    monkeypatch.setenv(beam_runners.PRISM_ENV, str(prism))
    with pytest.raises(InputError, match=r"Prism's binary is not at .*; build it with `make pr"):
        pipeline_options(["--runner=PrismRunner"])
    prism.write_text("#!/bin/sh\n")
    prism.chmod(0o755)
    options = pipeline_options(["--runner=PrismRunner"]).view_as(PrismRunnerOptions)
    assert (options.prism_location, options.prism_log_level) == (str(prism), "warn")
    monkeypatch.delenv(beam_runners.PRISM_ENV)
    assert beam_runners.prism_binary().endswith("/elastic-step/prism/v2.77.0/prism")


def test_beam_options_without_the_beam_runner_are_an_error(tmp_path: Path, capsys) -> None:
    csv = write_csv(tmp_path / "wine.csv", rows=20)
    argv = ["preprocess", "--input", str(csv), "--label", "cultivar", "--fill-missing", "mean",
            "--output", str(tmp_path / "out"), "--beam-option=--runner=DataflowRunner"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == "elastic-step: error: --beam-option applies to --runner beam only"


def test_without_beam_the_beam_runner_says_what_to_install(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "apache_beam", None)  # import apache_beam fails
    csv = write_csv(tmp_path / "wine.csv", rows=20)
    argv = ["preprocess", "--input", str(csv), "--label", "cultivar", "--fill-missing", "mean",
            "--output", str(tmp_path / "out"), "--runner", "beam"]  # fmt: skip
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == f"elastic-step: error: {BEAM_MISSING}"


def test_the_kfp_step_passes_beam_options_as_the_command_reads_them() -> None:
    """A value that starts with '-' goes as --flag=VALUE: argparse takes it for a flag."""
    options = ["--runner=DataflowRunner", "--project=p"]
    argv = arguments("preprocess", {"runner": "beam", "beam_options": options})
    assert argv == ["--runner", "beam", *(f"--beam-option={o}" for o in options)]
    required = ["--input", "data.csv", "--label", "y", "--output", "data"]
    parsed = command_parser("preprocess").parse_args(required + argv)
    assert parsed.runner == "beam" and parsed.beam_option == options


def test_plain_preprocess_does_not_import_beam(tmp_path: Path) -> None:
    csv = write_csv(tmp_path / "wine.csv", rows=20)
    code = (
        "import sys\n"
        "from elastic_step.cli import main\n"
        f"main(['preprocess', '--input', {str(csv)!r}, '--label', 'cultivar',"
        f" '--fill-missing', 'mean', '--output', {str(tmp_path / 'out')!r}])\n"
        "print('apache_beam' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"


# -- csv_ranges: the cuts --

TRICKY = (
    '\ufeff"first\nname",b,"c"\r\n'  # a byte-order mark, a header over two lines
    '1,"x\r\ny",2\r\n'  # a CRLF inside quotes
    "\r\n"  # a blank line
    '3,"he said ""go""\nthen ""stop""",4\n'
    '5,plain,"6"\n'
    '7,"ends with a line end\n",8\n'
    '9,"",10'  # no line end at the end
)


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 5, 8, 13, 40, 1000])
def test_ranges_hold_whole_rows(chunk_bytes: int, tmp_path: Path) -> None:
    """Read range by range, at any chunk size, the file gives the rows of one pass, quoted
    line ends, doubled quotes, blank lines and a last line without a line end included."""
    path = tmp_path / "tricky.csv"
    path.write_bytes(TRICKY.encode())
    source = CsvSource(str(path))
    assert source.header == ["first\nname", "b", "c"]
    data_start, size = source.data_offset(), source.total_bytes
    starts = chunk_starts(data_start, size, chunk_bytes)
    ends = [*starts[1:], size]
    chunks = [chunk_quotes(str(path), s, e) for s, e in zip(starts, ends, strict=True)]
    ranges = row_ranges(data_start, size, chunks[::-1])  # in any order

    assert [r.index for r in ranges] == list(range(len(ranges)))
    assert [r.start for r in ranges] == [data_start] + [r.end for r in ranges[:-1]]
    assert ranges[-1].end == size
    whole = [row for batch in source.batches() for row in rows(batch)]
    assert len(whole) == 5 and whole[1] == ["3", 'he said "go"\nthen "stop"', "4"]
    parts = [
        row
        for r in ranges
        for batch in source.range_batches(r.start, r.end, 0)
        for row in rows(batch)
    ]
    assert parts == whole
    if chunk_bytes <= 13:
        assert len(ranges) >= 3  # really cut


def rows(batch) -> list[list[str]]:
    return [list(row) for row in zip(*(c.to_pylist() for c in batch.columns), strict=True)]


def test_a_range_file_appears_whole_or_not_at_all(tmp_path: Path) -> None:
    """A range's records by bucket (spill.RangeParts): nothing is published when the range
    fails midway (a retried or backup run never shows half a file), and each bucket's blocks
    read back in key order."""
    import pyarrow as pa

    from elastic_step.data.spill import RangeParts, sorted_blocks

    path = str(tmp_path / "pieces" / "range-000000.blocks")
    keys = np.array([5, 3, 1], dtype=np.uint64)
    with (
        pytest.raises(RuntimeError, match="the worker died"),
        RangeParts(path, flush_bytes=1) as parked,
    ):
        parked.add(np.array([0, 1, 0]), keys, pa.array([b"a", b"b", b"c"]))
        raise RuntimeError("the worker died")
    assert not (tmp_path / "pieces").exists() or not list((tmp_path / "pieces").iterdir())
    with RangeParts(path, flush_bytes=1) as parked:
        parked.add(np.array([0, 1, 0]), keys, pa.array([b"a", b"b", b"c"]))
        parked.add(np.array([1]), np.array([0], dtype=np.uint64), pa.array([b"d"]))
    assert len(parked.index[1]) == 2  # two blocks: a flush after each add
    assert sorted_blocks(parked.index[0]).to_pylist() == [b"c", b"a"]
    assert sorted_blocks(parked.index[1]).to_pylist() == [b"d", b"b"]
