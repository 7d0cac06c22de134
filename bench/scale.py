"""The whole path of a recommendation job at growing sizes (issue 34): Criteo-shaped rows
(criteo_data.py) in Parquet, through every stage, with each stage's cost per row and memory.

At each size N (default 1 M, 3 M and 10 M rows):

1. **preprocess** the Parquet files (single machine), with vocabularies for id columns
   (:data:`VOCABULARY`);
2. **train** one epoch of the CTR example (examples/ctr.py) with 2 workers and 2 PS; once
   the epoch is :data:`KILL_AT` done, one worker and one PS are SIGKILLed (the PS restores
   its last checkpoint);
3. **evaluate** the model on the validation split (AUC);
4. **predict** every row of the Parquet files, with 2 workers.

Per stage it reports the wall time, the time per row, the peak RSS of each process (by
role: the master, the largest worker, the largest PS), and the bytes written. At
``--fit-size`` it also trains the same model under ``model.fit`` (Adam, the same batches) and
reports its examples/s and AUC beside elastic's. Per stage, ``growth`` is the time per row at
the largest size over that at the smallest (the issue asks for at most 1.3).

    .venv/bin/python bench/scale.py --sizes 1000000,3000000,10000000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import common
from common import log

HERE = os.path.dirname(os.path.abspath(__file__))
CTR = os.path.join(common.REPO, "elastic_step", "examples", "ctr.py")
#: Vocabulary settings for the id columns: the most frequent 500,000 values of each, the rest
#: hashed into 1,024 shared ids.
VOCABULARY = ["--max-vocabulary", "500000", "--oov-buckets", "1024", "--fill-missing", "zero"]
TRAIN = ["--workers", "2", "--ps", "2", "--epochs", "1", "--batch-size", "512",
         "--checkpoint-steps", "100"]  # fmt: skip
#: The training's --local-steps: windows of 4 steps, in tasks of 16 batches. The master's
#: choice (K = 16 here, in tasks of one batch of 512: windows of one step) trains at 0.7x
#: the speed; windows of 16 steps cost 0.009 of AUC (bench/README.md).
LOCAL_STEPS = 4
#: The share of the epoch trained when a worker and a PS are killed.
KILL_AT = 0.4
SAMPLE_S = 0.5
#: No stage runs longer (10 M rows' training takes about 17 minutes on 2 cores).
STAGE_TIMEOUT_S = 3 * 3600
SHARDS = 8


def _bytes_under(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(path)
        for name in names
    )


class JobMemory:
    """The peak RSS of a stage's own process (``pid``: the master of a job) and of each
    worker and PS that its status.json names, sampled until stopped; by role
    (``main``, ``workers``, ``ps``), the largest."""

    def __init__(self, pid: int, output: str) -> None:
        self.pid, self.output = pid, output
        self.peaks: dict[str, int] = {}
        self.status: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        try:
            with open(os.path.join(self.output, "status.json")) as f:
                self.status = json.load(f)
        except (OSError, ValueError):
            pass
        members = [("main", self.pid)]
        for role in ("workers", "ps"):
            for member in self.status.get(role) or []:
                if member.get("pid") and member.get("state") == "running":
                    members.append((role, member["pid"]))
        for role, pid in members:
            mb = common.peak_rss_mb(pid)
            if mb is not None:
                self.peaks[role] = max(self.peaks.get(role, 0), mb)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join(timeout=10)
        return dict(self.peaks)


def run_stage(name: str, command: list[str], rows: int, output: str, log_path: str,
              on_status=None) -> dict:  # fmt: skip
    """Runs one stage's command; its wall time, time per row, peaks and bytes written."""
    log(f"{name}: {' '.join(command[2:])}")
    started = time.perf_counter()
    with open(log_path, "w") as log_file:
        process = subprocess.Popen(command, cwd=common.REPO, stdout=log_file,
                                   stderr=subprocess.STDOUT)  # fmt: skip
        memory = JobMemory(process.pid, output)
        try:
            while True:
                # Reaped here, for its rusage (see below).
                pid, status, usage = os.wait4(process.pid, os.WNOHANG)
                if pid:
                    break
                if time.perf_counter() - started > STAGE_TIMEOUT_S:
                    process.kill()
                    process.wait(timeout=60)
                    raise SystemExit(f"{name} ran past {STAGE_TIMEOUT_S} s; see {log_path}")
                time.sleep(SAMPLE_S)
                if on_status is not None:
                    on_status(memory.status)
        finally:
            peaks = memory.stop()
    wall = time.perf_counter() - started
    # The stage's own process: its peak as sampled (VmHWM, every SAMPLE_S until it exits).
    # wait4's ru_maxrss counts its reaped descendants too (the local backend's fork server,
    # and every worker and PS forked from it): only for a process gone before its first
    # sample does it stand in.
    peaks.setdefault("main", usage.ru_maxrss // 1024)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{name} failed with exit status {code}; see {log_path}")
    result = {
        "wall_s": round(wall, 1),
        "us_per_row": round(wall / rows * 1e6, 2),
        "peak_rss_mb": peaks,
        "bytes_written": _bytes_under(output),
    }
    log(f"{name}: {wall:.1f} s ({result['us_per_row']} us/row), peak RSS {peaks}, "
        f"{result['bytes_written'] / 1e6:.0f} MB written")  # fmt: skip
    return result


class Killer:
    """Kills one running worker and one PS, once, when the epoch is KILL_AT done."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.killed: dict[str, str] = {}

    def _checkpoints(self) -> set[str]:
        """The PS shards that have written a checkpoint."""
        root = os.path.join(self.output, "checkpoints")
        return {
            os.path.relpath(base, root)
            for base, _, names in os.walk(root)
            if any(name.startswith("version-") and name.endswith(".npz") for name in names)
        }

    def __call__(self, status: dict) -> None:
        if self.killed or (status.get("progress") or {}).get("fraction", 0) < KILL_AT:
            return
        worker = next((w for w in status.get("workers", []) if w["state"] == "running"), None)
        ps = next((p for p in status.get("ps", []) if p["state"] == "running"), None)
        if worker is None or ps is None or len(self._checkpoints()) < 2:
            return  # each PS shard has written a checkpoint before one dies
        for member in (worker, ps):
            try:
                os.kill(member["pid"], signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.killed[member["id"]] = f"SIGKILL at {status['progress']['fraction']:.0%}"
        log(f"  killed {', '.join(self.killed)}")


def ensure_data(workdir: str, rows: int) -> str:
    """The Criteo-shaped Parquet files of ``rows`` rows (made once, seed 0)."""
    directory = os.path.join(workdir, f"criteo-{rows}")
    about = os.path.join(directory, "criteo.json")
    if os.path.exists(about):
        with open(about) as f:
            if json.load(f).get("rows") == rows:
                return directory
    shutil.rmtree(directory, ignore_errors=True)
    sys.path.insert(0, HERE)
    from criteo_data import generate

    log(f"generating {rows:,} rows into {directory}")
    generate(directory, rows=rows, shards=SHARDS, seed=0, formats=("parquet",), log=log)
    return directory


def one_size(args: argparse.Namespace, rows: int) -> dict:
    work = os.path.join(args.workdir, f"n{rows}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    raw = ensure_data(args.workdir, rows)
    elastic = common.elastic_step_command()
    data, run = os.path.join(work, "data"), os.path.join(work, "run")
    stages = {}
    stages["preprocess"] = run_stage(
        "preprocess",
        [*elastic, "preprocess", "--input", raw, "--label", "label", "--output", data,
         *VOCABULARY],
        rows, data, os.path.join(work, "preprocess.log"),
    )  # fmt: skip
    killer = Killer(run)
    local_steps = ["--local-steps", str(args.local_steps)] if args.local_steps else []
    stages["train"] = run_stage(
        "train",
        [*elastic, "train", "--model-def", CTR, "--data", data, "--output", run, *TRAIN,
         *local_steps],
        rows, run, os.path.join(work, "train.log"), on_status=killer,
    )  # fmt: skip
    with open(os.path.join(run, "summary.json")) as f:
        summary = json.load(f)
    stages["train"].update(
        {
            "examples_per_s": summary.get("examples_per_second"),
            "killed": killer.killed,
            "restarts": summary["restarts"],
            "ps_restores": summary["ps_restores"],
            "accounting_exact": common.accounting_exact(summary["epochs"]),
            "auc": summary["metrics"].get("auc"),
        }
    )
    metrics = os.path.join(work, "metrics.json")
    stages["evaluate"] = run_stage(
        "evaluate",
        [*elastic, "evaluate", "--model", run, "--data", data, "--metrics-output", metrics],
        rows, metrics, os.path.join(work, "evaluate.log"),
    )  # fmt: skip
    with open(metrics) as f:
        stages["evaluate"]["auc"] = json.load(f)["metrics"].get("auc")
    predictions = os.path.join(work, "predict")
    stages["predict"] = run_stage(
        "predict",
        [*elastic, "predict", "--model", run, "--input", raw, "--output", predictions,
         "--workers", "2"],
        rows, predictions, os.path.join(work, "predict.log"),
    )  # fmt: skip
    with open(os.path.join(predictions, "predictions.csv")) as f:
        stages["predict"]["rows_predicted"] = sum(1 for _ in f) - 1
    with open(os.path.join(raw, "criteo.json")) as f:
        about = json.load(f)
    return {"rows": rows, "best_auc": about["best_auc"], "distinct": about["distinct_total"],
            "stages": stages}  # fmt: skip


def fit_child(data: str, out: str) -> None:
    """The CTR model under ``model.fit``: one epoch, Adam, the same batch size, shuffled."""
    import keras
    import tensorflow as tf

    from elastic_step.data.schema import Schema
    from elastic_step.model.definition import load_model_definition

    schema = Schema.load(data)
    definition = load_model_definition(CTR, schema)
    batch = int(TRAIN[TRAIN.index("--batch-size") + 1])
    model = definition.build_model()
    metrics = definition.build_metrics()
    model.compile(optimizer=definition.build_optimizer(), loss=definition.loss,
                  metrics=list(metrics.values()))  # fmt: skip
    train = [p for p, _ in schema.shard_paths(data, "train")]
    held_out = [p for p, _ in schema.shard_paths(data, "validation")]
    steps = math.ceil(schema.records["train"] / batch)
    dataset = definition.feed(
        tf.data.TFRecordDataset(train).shuffle(100_000, seed=0).batch(batch)
        .apply(tf.data.experimental.assert_cardinality(steps)),
        "train", schema,
    ).prefetch(2)  # fmt: skip
    started = time.perf_counter()
    model.fit(dataset, epochs=1, verbose=0, shuffle=False)
    wall = time.perf_counter() - started
    validation = definition.feed(tf.data.TFRecordDataset(held_out).batch(batch), "evaluate", schema)
    model.evaluate(validation, verbose=0)
    auc = float(metrics["auc"].result())
    result = {"wall_s": round(wall, 1), "examples_per_s": round(schema.records["train"] / wall),
              "auc": auc, "trainable_parameters": int(sum(
                  math.prod(v.shape) for v in model.trainable_variables))}  # fmt: skip
    del keras
    with open(out, "w") as f:
        json.dump(result, f)


def run_fit(args: argparse.Namespace, rows: int) -> dict:
    data = os.path.join(args.workdir, f"n{rows}", "data")
    out = os.path.join(args.workdir, f"fit-{rows}.json")
    log(f"fit: the same model under model.fit on {rows:,} rows")
    subprocess.run([sys.executable, os.path.abspath(__file__), "--fit-child", data, out],
                   check=True, cwd=common.REPO)  # fmt: skip
    with open(out) as f:
        result = json.load(f)
    log(f"fit: {result['examples_per_s']:,} examples/s, AUC {result['auc']:.4f}")
    return result


def print_table(document: dict) -> None:
    sizes = document["sizes"]
    shown = ", ".join(f"{size['rows']:,}" for size in sizes)
    local = document["local_steps"] or "the master's choice"
    print(f"\n== bench-scale: {shown} rows; --local-steps: {local} ==")
    print(f"{'stage':<11} {'rows':>11} {'wall s':>8} {'us/row':>8} {'main':>7} "
          f"{'worker':>7} {'PS':>7} {'written':>9}")  # fmt: skip
    for stage in ("preprocess", "train", "evaluate", "predict"):
        for size in sizes:
            s = size["stages"][stage]
            peaks = s["peak_rss_mb"]
            print(f"{stage:<11} {size['rows']:>11,} {s['wall_s']:>8.1f} {s['us_per_row']:>8.2f} "
                  f"{peaks.get('main', 0):>6}M {peaks.get('workers', 0):>6}M "
                  f"{peaks.get('ps', 0):>6}M {s['bytes_written'] / 1e6:>8.0f}M")  # fmt: skip
        if stage in document["growth"]:
            print(f"{'':<11} growth of the time per row: {document['growth'][stage]:.2f}")
    for size in sizes:
        train = size["stages"]["train"]
        print(f"{size['rows']:,} rows: train {train['examples_per_s'] or 0:,.0f} examples/s, AUC "
              f"{train['auc']:.4f} (evaluate {size['stages']['evaluate']['auc']:.4f}; best "
              f"{size['best_auc']}); killed {', '.join(train['killed']) or 'none'}; accounting "
              f"{'exact' if train['accounting_exact'] else 'NOT EXACT'}")  # fmt: skip
    fit = document.get("fit")
    if fit:
        ratio = fit["elastic_over_fit"]
        shown = "n/a" if ratio is None else f"{ratio:.2f}"
        print(f"fit at {fit['rows']:,} rows: {fit['examples_per_s']:,} examples/s, AUC "
              f"{fit['auc']:.4f}; elastic / fit = {shown}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        default="1000000,3000000,10000000",
        type=lambda t: common.distinct_ints(t, minimum=1000, what="sizes"),
    )
    parser.add_argument(
        "--fit-size",
        type=int,
        default=1_000_000,
        help="rows at which model.fit runs too (0: none; must be a size)",
    )
    parser.add_argument(
        "--local-steps",
        type=int,
        default=LOCAL_STEPS,
        help=f"the training's --local-steps (default {LOCAL_STEPS}, the throughput-first "
        "setting for this job in bench/README.md; 0: the master chooses)",
    )
    parser.add_argument("--workdir", default=os.path.join(HERE, "results", "scale"))
    parser.add_argument("--fit-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fit_child:
        fit_child(*args.fit_child)
        return 0
    common.start(args)
    log(f"load average {common.load_average()} ({os.cpu_count()} CPUs); results in "
        f"{args.workdir}")  # fmt: skip
    document = {**common.run_header(load=common.load_average()), "sizes": [], "growth": {},
                "local_steps": args.local_steps}  # fmt: skip
    for rows in sorted(args.sizes):
        document["sizes"].append(one_size(args, rows))
        if rows == args.fit_size:
            fit = run_fit(args, rows)
            # None: a job too short for the master to measure its steady rate.
            elastic = document["sizes"][-1]["stages"]["train"]["examples_per_s"]
            ratio = None if elastic is None else round(elastic / fit["examples_per_s"], 3)
            document["fit"] = {**fit, "rows": rows, "elastic_over_fit": ratio}
        small, large = document["sizes"][0], document["sizes"][-1]
        for stage in ("preprocess", "train", "evaluate", "predict"):
            if large is not small:
                document["growth"][stage] = round(
                    large["stages"][stage]["us_per_row"] / small["stages"][stage]["us_per_row"],
                    2,
                )
        common.write_result(os.path.join(args.workdir, "scale.json"), document)
    print_table(document)
    log(f"wrote {os.path.join(args.workdir, 'scale.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
