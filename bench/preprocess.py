"""Preprocessing: `elastic-step preprocess` against a plain pandas -> tf.train.Example loop.

Writes a CSV of ``--rows`` rows x ``--columns`` columns (numeric features, a few categorical
ones and a 10-class label), then, one after the other in child processes (never at the same
time, so they do not compete for the cores):

- elastic: the real CLI, ``elastic-step preprocess --input CSV --label label --output DIR``
  (type inference, checks, stratified split, shuffled shards with indexes, schema);
- pandas: ``pd.read_csv``, then one ``tf.train.Example`` per row, serialized and written with
  ``tf.io.TFRecordWriter``: the loop a user would write (no split, shuffle or statistics);
- elastic at a tenth of the rows, to show that its peak memory does not grow with the input;
- beam: the same CLI with ``--runner beam``, an Apache Beam pipeline, at each of
  ``--beam-rows`` (default 2,000,000 and 10,000,000) on each of ``--beam-runners``: Beam's
  local runner (FnApiRunner, in the child), Dask's distributed scheduler with 2 worker
  processes, and Prism with an external pool of SDK workers (bench/beam_clusters.py starts
  them, fresh for each run). Each output must be the elastic run's at that size, file for file.

Each side's rows/s is rows over the child's wall time, start-up included; peak RSS is the
child's ``ru_maxrss``, and for a Beam run also every other process's (the scheduler, each
worker, Prism, the pool and its SDK workers). Targets: elastic peak RSS < 1 GB, elastic rows/s
>= 3x pandas'; for Beam, no process's peak grows more than 1.3x from the smallest of
``--beam-rows`` to the largest. Beam's rows/s have no target; their ratio to elastic's is
reported.
Results go to ``WORKDIR/preprocess.json`` (default ``bench/results/``). See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime
import filecmp
import os
import platform
import shutil
import subprocess
import sys
import threading
import time

from beam_clusters import Cluster, PeakMemory
from common import (
    HERE,
    REPO,
    code_version,
    elastic_step_command,
    load_average,
    log,
    write_result,
)

RSS_TARGET_MB = 1024
GROWTH_TARGET = 1.3
RUNNERS = ("local", "dask", "prism")
SPEED_TARGET = 3.0
# What TensorFlow's C++ prints at import in the pandas child: noise in the progress display.
TF_BANNER = ("I0000", "E0000", "W0000", "WARNING: All log messages", "To enable the following")
CATEGORIES = ["red", "green", "blue", "amber", "violet", "cyan", "black", "white"]


def write_csv(path: str, rows: int, columns: int, categorical: int, seed: int) -> None:
    """``columns`` columns: numeric features (4 decimals), ``categorical`` text columns of 8
    values, and ``label`` (10 classes); written in chunks, with a progress line per 10%."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv

    numeric = columns - categorical - 1
    rng = np.random.default_rng(seed)
    names = [f"f{i}" for i in range(numeric)] + [f"c{i}" for i in range(categorical)] + ["label"]
    schema = pa.schema(
        [(n, pa.float64()) for n in names[:numeric]]
        + [(n, pa.string()) for n in names[numeric:-1]]
        + [("label", pa.int64())]
    )
    chunk = 100_000
    with pacsv.CSVWriter(path, schema) as writer:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            x = np.round(rng.normal(size=(n, numeric)), 4)
            text = [pa.array(rng.choice(CATEGORIES, n)) for _ in range(categorical)]
            label = np.argmax(x[:, :10] + rng.normal(size=(n, 10)), axis=1)
            arrays = [pa.array(x[:, i]) for i in range(numeric)] + text + [pa.array(label)]
            writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
            if (start // chunk) % max(1, rows // chunk // 10) == 0:
                log(f"  wrote {start + n:,} of {rows:,} rows")


def pandas_loop(csv_path: str, output: str) -> None:
    """The baseline, run in its own process: pandas, then one Example per row."""
    import pandas as pd
    import tensorflow as tf

    frame = pd.read_csv(csv_path)
    numeric = [c for c in frame.columns if c != "label" and frame[c].dtype.kind == "f"]
    text = [c for c in frame.columns if c != "label" and c not in numeric]
    with tf.io.TFRecordWriter(output) as writer:
        for row in frame.itertuples(index=False):
            values = row._asdict()
            feature = {
                c: tf.train.Feature(float_list=tf.train.FloatList(value=[values[c]]))
                for c in numeric
            }
            for c in text:
                feature[c] = tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[values[c].encode()])
                )
            feature["label"] = tf.train.Feature(
                int64_list=tf.train.Int64List(value=[values["label"]])
            )
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())


def run_child(name: str, command: list[str], rows: int, memory: PeakMemory | None = None) -> dict:
    """Runs ``command``, showing its output and its memory every 10 s; rows/s and peak RSS
    (with ``memory``, also the peaks it sampled, by role)."""
    log(f"{name}: {' '.join(command)}")
    started = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if memory is not None:
        memory.watch(process.pid, "driver")
    done = threading.Event()

    def show_memory() -> None:
        while not done.wait(10):
            try:
                with open(f"/proc/{process.pid}/status") as f:
                    rss = next(line.split()[1] for line in f if line.startswith("VmRSS"))
            except (OSError, StopIteration):
                continue
            log(f"  {name}: {time.perf_counter() - started:.0f}s, RSS {int(rss) // 1024} MB")

    watcher = threading.Thread(target=show_memory, daemon=True)
    watcher.start()
    assert process.stdout is not None
    for line in process.stdout:
        if not line.startswith(TF_BANNER):
            print("    | " + line.rstrip(), flush=True)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    if process.returncode != 0:
        raise SystemExit(f"{name} failed with exit status {process.returncode}")
    result = {
        "rows": rows,
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "rows_per_s": round(rows / wall),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "command": command,
    }
    log(
        f"{name}: {result['rows_per_s']:,} rows/s ({wall:.1f} s wall, {result['cpu_s']} s CPU), "
        f"peak RSS {result['peak_rss_mb']} MB"
    )
    return result


def same_files(a: str, b: str) -> bool:
    """Whether directories ``a`` and ``b`` hold the same files, byte for byte."""
    names = [sorted(os.path.relpath(os.path.join(root, f), top) for root, _, files in os.walk(top)
                    for f in files) for top in (a, b)]  # fmt: skip
    if names[0] != names[1]:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, names[0], shallow=False)
    return not mismatch and not errors


def beam_rows(args: argparse.Namespace, elastic, output) -> list[dict]:
    """At each of ``--beam-rows``: the single-machine path, then each runner of
    ``--beam-runners`` on a fresh cluster; each row with its ratio to the single machine and
    whether it wrote the same files."""
    rows = []
    extra = [f"--beam-option={option}" for option in args.beam_option]
    for size in args.beam_rows:
        reference = elastic(str(size))
        rows.append({"runner": "single machine", **reference})
        for runner in args.beam_runners:
            with PeakMemory() as memory:
                cluster = Cluster(runner, args.workdir, memory)
                try:
                    options = [f"--beam-option={option}" for option in cluster.options]
                    result = elastic(str(size), f"beam-{runner}", "--runner", "beam",
                                     *options, *extra, memory=memory)  # fmt: skip
                finally:
                    cluster.stop()
            result["peak_rss_mb_by_process"] = dict(memory.peaks)
            result["peak_rss_mb_by_process"]["driver"] = max(
                result["peak_rss_mb"], memory.peaks.get("driver", 0)
            )
            result["ratio"] = round(result["rows_per_s"] / reference["rows_per_s"], 2)
            result["same_output"] = same_files(
                output(str(size), "elastic"), output(str(size), f"beam-{runner}")
            )
            shutil.rmtree(output(str(size), f"beam-{runner}"), ignore_errors=True)
            log(f"beam on {runner}, {size:,} rows: {result['rows_per_s']:,} rows/s, "
                f"{result['ratio']:.2f} x the single machine; the same files: "
                f"{'yes' if result['same_output'] else 'NO'}; peak RSS by process (MB): "
                f"{result['peak_rss_mb_by_process']}")  # fmt: skip
            rows.append({"runner": runner, **result})
        shutil.rmtree(output(str(size), "elastic"), ignore_errors=True)
    return rows


def beam_growth(rows: list[dict], sizes: list[int]) -> dict:
    """Each runner's and process's peak RSS at the largest size over the smallest; logs the
    verdict against :data:`GROWTH_TARGET`."""
    small, large = min(sizes), max(sizes)
    growth: dict = {}
    for runner in {row["runner"] for row in rows} - {"single machine"}:
        peaks = {row["rows"]: row["peak_rss_mb_by_process"] for row in rows
                 if row["runner"] == runner}  # fmt: skip
        if small == large or small not in peaks or large not in peaks:
            continue
        for role, mb in peaks[large].items():
            if role in peaks[small] and peaks[small][role]:
                ratio = round(mb / peaks[small][role], 2)
                growth[f"{runner}: {role}"] = ratio
                verdict = "PASS" if ratio <= GROWTH_TARGET else "ABOVE"
                log(f"beam on {runner}, {role}: peak RSS {peaks[small][role]} MB at "
                    f"{small:,} rows, {mb} MB at {large:,}: x{ratio} (target <= "
                    f"{GROWTH_TARGET}): {verdict}")  # fmt: skip
    return growth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="(default 2,000,000)")
    parser.add_argument("--columns", type=int, default=32, help="label included (default 32)")
    parser.add_argument(
        "--categorical", type=int, default=3, help="text columns among them (default 3)"
    )
    parser.add_argument("--seed", type=int, default=0, help="(default 0)")
    parser.add_argument(
        "--workdir",
        default=os.path.join(HERE, "results"),
        help="CSVs, outputs and preprocess.json (default bench/results/)",
    )
    parser.add_argument(
        "--only", choices=["elastic", "pandas", "beam"], help="run one side (no ratio then)"
    )
    parser.add_argument(
        "--beam-rows",
        type=lambda t: [int(v) for v in t.split(",")],
        default=[2_000_000, 10_000_000],
        help="the sizes of the Beam runs (default 2000000,10000000)",
    )
    parser.add_argument(
        "--beam-runners",
        type=lambda t: t.split(","),
        default=list(RUNNERS),
        help=f"of {', '.join(RUNNERS)} (default all)",
    )
    parser.add_argument(
        "--beam-option",
        action="append",
        default=[],
        metavar="OPT",
        help="passed on to every beam run",
    )
    parser.add_argument("--pandas-loop", nargs=2, metavar=("CSV", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pandas_loop:
        pandas_loop(*args.pandas_loop)
        return 0

    os.makedirs(args.workdir, exist_ok=True)
    for runner in args.beam_runners:
        if runner not in RUNNERS:
            parser.error(f"--beam-runners: {runner!r} is not one of {', '.join(RUNNERS)}")
    sizes = {"full": args.rows, "tenth": args.rows // 10}
    if args.only in (None, "beam"):
        sizes.update({str(rows): rows for rows in args.beam_rows})
    csvs = {}
    for size, rows in sizes.items():
        csvs[size] = os.path.join(args.workdir, f"preprocess-{rows}x{args.columns}.csv")
        if not os.path.exists(csvs[size]):
            log(f"writing {rows:,} rows x {args.columns} columns to {csvs[size]}")
            partial = csvs[size] + ".partial"
            write_csv(partial, rows, args.columns, args.categorical, args.seed)
            os.replace(partial, csvs[size])
    results: dict = {
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        "code": code_version(),
        "machine": f"{os.cpu_count()} CPUs, {platform.python_version()}",
        "rows": args.rows,
        "columns": args.columns,
        "csv_mb": round(os.path.getsize(csvs["full"]) / 2**20),
        "load_before": load_average(),
    }

    def output(size: str, name: str) -> str:
        return os.path.join(args.workdir, f"preprocess-out-{size}-{name}")

    def elastic(size: str, name: str = "elastic", *flags: str, memory=None) -> dict:
        shutil.rmtree(output(size, name), ignore_errors=True)
        command = [*elastic_step_command(), "preprocess", "--input", csvs[size],
                   "--label", "label", "--output", output(size, name), *flags]  # fmt: skip
        return run_child(f"{name} ({size})", command, sizes[size], memory)

    if args.only in (None, "elastic"):
        results["elastic"] = elastic("full")
        results["elastic_tenth"] = elastic("tenth")
    if args.only in (None, "beam"):
        results["beam"] = beam_rows(args, elastic, output)
    if args.only in (None, "pandas"):
        out = os.path.join(args.workdir, "preprocess-pandas.tfrecord")
        command = [sys.executable, os.path.abspath(__file__), "--pandas-loop", csvs["full"], out]
        results["pandas"] = run_child("pandas", command, args.rows)
    results["load_after"] = load_average()
    if "elastic" in results and "pandas" in results:
        ratio = results["elastic"]["rows_per_s"] / results["pandas"]["rows_per_s"]
        results["ratio"] = round(ratio, 2)
        rss = max(results["elastic"]["peak_rss_mb"], results["elastic_tenth"]["peak_rss_mb"])
        speed_ok = "PASS" if ratio >= SPEED_TARGET else "BELOW"
        rss_ok = "PASS" if rss < RSS_TARGET_MB else "ABOVE"
        log(f"ratio elastic / pandas: {ratio:.2f} (target >= {SPEED_TARGET}): {speed_ok}")
        log(f"elastic peak RSS: {rss} MB (target < {RSS_TARGET_MB} MB): {rss_ok}")
    if "beam" in results:
        results["beam_growth"] = beam_growth(results["beam"], args.beam_rows)
    path = os.path.join(args.workdir, "preprocess.json")
    write_result(path, results)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
