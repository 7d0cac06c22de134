"""`preprocess --runner beam` with workers outside this process: on Dask's distributed
scheduler (2 worker processes) and on Prism with an external pool of SDK workers. Each writes
what the single-machine path writes, byte for byte, from a file read as many ranges and shards
written as several buckets, and from Parquet files read a row group at a time; a bad value is
the single-machine path's one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from file_trees import tree

from elastic_step.cli import main
from elastic_step.data.beam_preprocess import preprocess_on_beam
from elastic_step.data.preprocess import MemoryBudget, preprocess
from elastic_step.errors import InputError

# Several buckets per shard (written as pieces, then joined), and ranges of a few kB.
TINY = MemoryBudget(block_bytes=1024, batch_bytes=4096, spill_bytes=8192, bucket_bytes=16384)
SMALL_CHUNKS = 8000
SETTINGS = {"label": "label", "fill_missing": "mean", "shards": 3, "seed": 4}


def write_csv(path: Path, rows: int = 3000, bad_line: int | None = None) -> Path:
    """Numeric columns with empty cells, a categorical one with quoted commas and line ends,
    and a 3-class label."""
    rng = np.random.default_rng(11)
    places = ['"north, east"', '"south\nwest"', "centre", ""]
    lines = ["x,y,place,label"]
    for i in range(rows):
        x = "" if i % 13 == 0 else f"{rng.normal(3, 2):.4f}"
        lines.append(f"{x},{rng.lognormal(0, 2):.5g},{places[i % 4]},{'abc'[i % 3]}")
    if bad_line is not None:
        lines[bad_line - 1] = "oops,1,centre,a"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path, Path]:
    """The CSV, what the single-machine path wrote from it with the tiny budget, and with the
    default one; the same rows as two Parquet files of several row groups, and what the
    single-machine path wrote from those."""
    root = tmp_path_factory.mktemp("data")
    csv = write_csv(root / "places.csv")
    preprocess(input_path=str(csv), output=str(root / "tiny"), memory=TINY, **SETTINGS)
    preprocess(input_path=str(csv), output=str(root / "plain"), **SETTINGS)
    table = pacsv.read_csv(csv)
    parquet = root / "parquet"
    parquet.mkdir()
    pq.write_table(table.slice(0, 1700), parquet / "a.parquet", row_group_size=400)
    pq.write_table(table.slice(1700), parquet / "b.parquet", row_group_size=400)
    preprocess(input_path=str(parquet), output=str(root / "from-parquet"), **SETTINGS)
    return csv, root / "tiny", root / "plain", parquet, root / "from-parquet"


def run_both_ways(options: list[str], data, tmp_path: Path) -> None:
    """Many ranges and pieces through the function, the command with its defaults, and
    Parquet input (a part per row group)."""
    csv, tiny, plain, parquet, from_parquet = data
    out = tmp_path / "ranges"
    schema = preprocess_on_beam(
        input_path=str(csv),
        output=str(out),
        memory=TINY,
        chunk_bytes=SMALL_CHUNKS,
        beam_options=options,
        **SETTINGS,
    )
    assert tree(out) == tree(tiny)
    assert sum(schema.records.values()) == 3000

    command = ["preprocess", "--input", str(csv), "--output", str(tmp_path / "command"),
               "--label", "label", "--fill-missing", "mean", "--shards", "3", "--seed", "4",
               "--runner", "beam", *(f"--beam-option={option}" for option in options)]  # fmt: skip
    assert main(command) == 0
    assert tree(tmp_path / "command") == tree(plain)

    preprocess_on_beam(
        input_path=str(parquet), output=str(tmp_path / "parquet"), beam_options=options,
        **SETTINGS,
    )  # fmt: skip
    assert tree(tmp_path / "parquet") == tree(from_parquet)


def test_dask_with_two_worker_processes(dask_cluster, data, tmp_path: Path) -> None:
    before = dask_cluster.tasks_run_per_worker()
    # The short name, and an option of the Dask runner's own module.
    run_both_ways(
        ["--runner=DaskRunner", f"--dask_client_address={dask_cluster.address}"], data, tmp_path
    )
    ran = [after - b for after, b in zip(dask_cluster.tasks_run_per_worker(), before, strict=True)]
    assert len(ran) == 2 and min(ran) > 0, ran  # both workers, not this process, did the work


def test_prism_with_an_external_worker_pool(worker_pool, data, tmp_path: Path) -> None:
    before = worker_pool.workers_started()
    # PrismRunner, --environment_type=EXTERNAL, --environment_config=localhost:PORT
    options = worker_pool.options
    run_both_ways(options, data, tmp_path)
    # A worker process from the pool for each pass (quotes, count, split, encode, write, join)
    # of each of the two runs of the CSV file (and more for the Parquet files).
    assert worker_pool.workers_started() - before >= 12


@pytest.mark.parametrize("runner", ["dask", "prism"])
def test_a_bad_value_on_a_worker_is_the_single_machine_line(
    runner: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    options = request.getfixturevalue(
        {"dask": "dask_cluster", "prism": "worker_pool"}[runner]
    ).options
    csv = write_csv(tmp_path / "bad.csv", bad_line=2500)
    messages = []
    for run in (preprocess, lambda **kw: preprocess_on_beam(
            chunk_bytes=SMALL_CHUNKS, beam_options=options, **kw)):  # fmt: skip
        with pytest.raises(InputError) as error:
            run(input_path=str(csv), output=str(tmp_path / "out"), **SETTINGS)
        messages.append(str(error.value))
    assert messages[0] == messages[1]
    # Row 2,500 is on line 3,125: a quoted value holds a line end every fourth row.
    assert messages[0].startswith(f"{csv}: line 3125: column 'x' has non-numeric value 'oops'")
    assert not (tmp_path / "out").exists()
