"""Model quality: `elastic-step train` with its default flags against a user's `model.fit`, over
seeds, data sets and worker counts.

For each data set the same model (bench/models/tabular.py, built from the data's schema, or
bench/models/wide_deep.py) is trained two ways, for the same epochs and batch size, on the same
TFRecord shards written by the real `elastic-step preprocess`:

- fit: Keras ``model.fit`` in a fresh process, the training records shuffled each epoch, the
  model evaluated on the validation split after the last epoch. Each epoch's shuffle is the
  permutation an elastic job of the same seed cuts its permuted tasks from
  (``elastic_step.worker.task_records.split_permutation``; :func:`fit_batches`), so that on a
  split small enough for them a seed means the same initial values and the same batches, in
  the same order, on both sides, and the two differ only by what elastic-step does
  differently;
- elastic: ``elastic-step train --workers W --ps 1`` with every other flag at its default; the
  validation metrics of its final evaluation round (``summary.json``).

Each side runs once per seed (the seed of the model's initial values and of the order of the
data; the data and its split stay those of seed 0), and the elastic side once per worker count.
A data set passes for W workers when

- classification: elastic's mean validation accuracy >= fit's minus max(1 point, one validation
  record's share);
- regression: elastic's mean validation loss (MSE) <= 1.05 x fit's;
- the spread: elastic's standard deviation over the seeds <= max(2 points, 2 x fit's) (for a
  regression, 2 points of fit's mean loss).

It prints each side's mean and standard deviation, the gap, the mean of the per-seed differences
(elastic minus fit, with its standard error), the wall time, and one line per data set saying
which side won; everything goes to ``WORKDIR/quality.json`` (default
``bench/results/quality/``). Nothing fails on a missed target: it is a benchmark. See
bench/README.md; tests/e2e/test_quality_bench.py runs one small case.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import common

MODELS = os.path.join(common.HERE, "models")
#: A fit child runs every seed of a data set; this bounds a hung one.
CHILD_TIMEOUT_S = 3600
#: An elastic job of this bench takes well under a minute on 2 cores.
JOB_TIMEOUT_S = 1200
#: The master's log line that says which --local-steps it chose.
LOCAL_STEPS = re.compile(r"local steps: (\d+) \(")
ACCURACY_POINTS = 0.01
LOSS_RATIO = 1.05
SPREAD_POINTS = 0.02
SPREAD_RATIO = 2.0


# -- data sets --


@dataclass(frozen=True)
class DataSet:
    """A data set of the bench: how to write its CSV, and how both sides train on it."""

    name: str
    write: Callable[[str], None]
    epochs: int
    batch_size: int
    #: The model: a file in bench/models/, and the environment it reads.
    model: str = "tabular.py"
    env: dict[str, str] = field(default_factory=dict)
    label: str = "label"
    regression: bool = False
    validation_fraction: float = 0.2
    about: str = ""


def _write_table(path: str, header: list[str], rows) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def _sklearn(loader: str, standardize_label: bool = False) -> Callable[[str], None]:
    """A scikit-learn data set's CSV; a numeric label standardized, as a user scales a
    regression's target (the MSE is then in units of its variance)."""

    def write(path: str) -> None:
        import sklearn.datasets

        data = getattr(sklearn.datasets, loader)()
        target = data.target
        if standardize_label:
            target = (target - target.mean()) / target.std()
        names = [f"f{i}" for i in range(data.data.shape[1])]
        rows = ([*(f"{v:.6g}" for v in x), f"{y:.6g}"] for x, y in zip(data.data, target,
                                                                     strict=True))  # fmt: skip
        _write_table(path, [*names, "label"], rows)

    return write


def write_categorical(path: str, rows: int = 40_000, seed: int = 0) -> None:
    """4 numeric columns and 3 categorical ones (20, 100 and 500 values, Zipf-like), a binary
    label from a hidden logistic model in which every column carries signal."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 4))
    logit = x @ np.array([0.8, -0.6, 0.4, 0.3]) + 0.5 * np.sin(2 * x[:, 0])
    cats = []
    for c, size in enumerate((20, 100, 500)):
        effect = rng.normal(scale=1.0, size=size)
        ids = np.minimum(rng.zipf(1.3, rows) - 1, size - 1)
        ids = (ids * 7 + c) % size
        logit += effect[ids]
        cats.append(ids)
    label = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(int)
    header = ["n0", "n1", "n2", "n3", "color", "shop", "item", "label"]
    table = (
        [*(f"{v:.5f}" for v in x[i]), *(f"{name}{cats[c][i]}" for c, name in
         enumerate(("c", "s", "i"))), label[i]]
        for i in range(rows)
    )  # fmt: skip
    _write_table(path, header, table)


def write_noisy(path: str, rows: int = 1_200, seed: int = 0) -> None:
    """A small, noisy problem: three classes from two numeric columns and a categorical one
    (30 values) through a hidden softmax model, so that even the best model errs often: about
    960 training rows (60 steps an epoch at batch 16) and 240 validation rows."""
    import numpy as np

    rng = np.random.default_rng(seed + 7)
    x = rng.normal(size=(rows, 2))
    category = rng.integers(0, 30, size=rows)
    logits = x @ rng.normal(scale=3.0, size=(2, 3)) + rng.normal(scale=2.5, size=(30, 3))[category]
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    label = np.array([rng.choice(3, p=p) for p in probabilities])
    table = ([f"{x[i, 0]:.5f}", f"{x[i, 1]:.5f}", f"k{category[i]}", label[i]] for i in range(rows))
    _write_table(path, ["a", "b", "kind", "label"], table)


def write_wide_deep(path: str) -> None:
    """bench/embedding.py's data (Zipf ids over a table, numeric columns, a binary label), at
    the size of this bench's table."""
    from embedding import write_csv

    settings = argparse.Namespace(rows=30_000, table_rows=20_000, features=8, zipf=1.2, seed=0)
    write_csv(path, settings)


DATA_SETS = {
    d.name: d
    for d in (
        DataSet("digits", _sklearn("load_digits"), epochs=10, batch_size=32,
                about="scikit-learn's digits: 1,797 rows, 64 pixels, 10 classes"),
        DataSet("wine", _sklearn("load_wine"), epochs=30, batch_size=16,
                about="scikit-learn's wine: 178 rows, 13 columns, 3 classes"),
        DataSet("breast_cancer", _sklearn("load_breast_cancer"), epochs=20, batch_size=16,
                about="scikit-learn's breast cancer: 569 rows, 30 columns, 2 classes"),
        # 10 epochs: fit's validation MSE is at its best there (0.58 ± 0.01 over 5 seeds; at
        # 40 it overfits, to 0.66 ± 0.06, and the seeds' spread hides any difference).
        DataSet("diabetes", _sklearn("load_diabetes", standardize_label=True), epochs=10,
                batch_size=16, regression=True,
                about="scikit-learn's diabetes: 442 rows, 10 columns, a standardized numeric "
                "label (MSE)"),
        DataSet("categorical", write_categorical, epochs=3, batch_size=64,
                validation_fraction=0.1,
                about="synthetic, 40,000 rows: 4 numeric and 3 categorical columns (embedded)"),
        DataSet("wide_deep", write_wide_deep, epochs=2, batch_size=64, model="wide_deep.py",
                validation_fraction=0.1,
                env={"BENCH_TABLE_ROWS": "20000", "BENCH_FEATURES": "8"},
                about="bench/embedding.py's wide-and-deep: 30,000 rows, a 20,000 x 16 table"),
        DataSet("noisy", write_noisy, epochs=8, batch_size=16,
                env={"BENCH_LEARNING_RATE": "0.02"},
                about="small and noisy: 1,200 training rows, batch 16, Adam(0.02), 8 epochs"),
    )
}  # fmt: skip


def prepare(data_set: DataSet, workdir: str) -> str:
    """The data set preprocessed by the real CLI (reused when already there); its directory."""
    root = os.path.join(workdir, data_set.name)
    os.makedirs(root, exist_ok=True)
    data_dir = os.path.join(root, "data")

    def write() -> str:
        csv_path = os.path.join(root, f"{data_set.name}.csv")
        data_set.write(csv_path)
        return csv_path

    label_type = "numeric" if data_set.regression else "class"
    flags = ["--label", data_set.label, "--label-type", label_type, "--shards", "2",
             "--validation-fraction", str(data_set.validation_fraction), "--seed", "0"]  # fmt: skip
    stamp = {"data_set": data_set.name, "flags": flags, "about": data_set.about}
    common.preprocess_once(data_dir, stamp, write, flags)
    return data_dir


def model_env(data_set: DataSet, data_dir: str) -> dict[str, str]:
    return {**os.environ, "BENCH_DATA": data_dir, **data_set.env}


def metric_of(data_set: DataSet) -> str:
    return "loss" if data_set.regression else "accuracy"


# -- fit --


def fit_batches(records: int, seed: int, epochs: int, batch_size: int):
    """The positions of ``model.fit``'s batches in the training split, its shards joined, for
    ``seed``: each epoch's permutation cut into batches, the short one last, as a dataset of
    every epoch's batches one after the other. The permutation is the one an elastic job of
    ``seed`` cuts its permuted tasks from, in position order, so with tasks of one batch fit's
    batch i of an epoch holds the records of the job's task i."""
    import numpy as np
    import tensorflow as tf

    from elastic_step.worker.task_records import split_permutation

    orders = np.stack([split_permutation(seed, epoch, records) for epoch in range(1, epochs + 1)])
    return tf.data.Dataset.from_tensor_slices(orders).flat_map(
        lambda order: tf.data.Dataset.from_tensor_slices(order).batch(batch_size)
    )


def fit_child(data_set: DataSet, data_dir: str, seeds: list[int], out: str) -> None:
    """``model.fit`` once per seed, shuffled each epoch (:func:`fit_batches`), as a user's
    script runs it; each run's validation metric and wall time, as JSON at ``out``."""
    import keras
    import tensorflow as tf

    from elastic_step.data.schema import Schema
    from elastic_step.model.definition import load_model_definition

    schema = Schema.load(data_dir)
    definition = load_model_definition(os.path.join(MODELS, data_set.model), schema)
    train = [path for path, _ in schema.shard_paths(data_dir, "train")]
    held_out = [path for path, _ in schema.shard_paths(data_dir, "validation")]
    records = schema.records["train"]
    steps = math.ceil(records / data_set.batch_size)
    # The split in memory, its shards joined in the schema's order, as a worker keeps it.
    split = tf.constant(list(tf.data.TFRecordDataset(train).as_numpy_iterator()))
    runs = []
    for seed in seeds:
        keras.utils.set_random_seed(seed)
        model = definition.build_model()
        feed = definition.feed
        metrics = definition.build_metrics()
        model.compile(optimizer=definition.build_optimizer(), loss=definition.loss,
                      metrics=list(metrics.values()))  # fmt: skip
        positions = fit_batches(records, seed, data_set.epochs, data_set.batch_size)
        batched = positions.map(lambda at: tf.gather(split, at))
        dataset = feed(batched, "train", schema).prefetch(2)
        held_out_steps = math.ceil(schema.records["validation"] / data_set.batch_size)
        validation = feed(
            tf.data.TFRecordDataset(held_out)
            .batch(data_set.batch_size)
            .apply(tf.data.experimental.assert_cardinality(held_out_steps)),
            "evaluate",
            schema,
        )
        started = time.perf_counter()
        # The records are shuffled above, each epoch anew; Keras would only warn that it
        # cannot shuffle a dataset. With steps_per_epoch Keras keeps one iterator over the
        # epochs, so each epoch takes the next epoch's batches.
        model.fit(dataset, epochs=data_set.epochs, steps_per_epoch=steps, verbose=0,
                  shuffle=False)  # fmt: skip
        wall = time.perf_counter() - started
        loss = model.evaluate(validation, verbose=0, return_dict=True)["loss"]
        # The metric objects hold the evaluation's state until the next reset.
        value = float(loss if data_set.regression else metrics["accuracy"].result())
        common.log(f"fit {data_set.name} seed {seed}: {metric_of(data_set)} {value:.4f} "
                   f"({wall:.1f} s)")  # fmt: skip
        runs.append({"seed": seed, "value": value, "wall_s": round(wall, 2)})
    with open(out, "w") as f:
        json.dump(runs, f)


def run_fit(args, data_set: DataSet, data_dir: str) -> list[dict]:
    out = os.path.join(args.workdir, data_set.name, "fit.json")
    command = [sys.executable, os.path.abspath(__file__), "--fit-child", out,
               "--data-sets", data_set.name, "--seeds", str(args.seeds),
               "--workdir", args.workdir]  # fmt: skip
    try:
        subprocess.run(command, check=True, cwd=common.REPO, timeout=CHILD_TIMEOUT_S,
                       env=model_env(data_set, data_dir))  # fmt: skip
    except subprocess.TimeoutExpired:
        raise SystemExit(f"fit on {data_set.name} took over {CHILD_TIMEOUT_S} s") from None
    with open(out) as f:
        return json.load(f)


# -- elastic --


def run_elastic(args, data_set: DataSet, data_dir: str, seed: int, workers: int) -> dict:
    output = os.path.join(args.workdir, data_set.name, f"elastic-w{workers}-s{seed}")
    shutil.rmtree(output, ignore_errors=True)  # a leftover job would be resumed, not rerun
    command = [*common.elastic_step_command(), "train",
               "--model-def", os.path.join(MODELS, data_set.model), "--data", data_dir,
               "--output", output, "--workers", str(workers), "--ps", "1",
               "--epochs", str(data_set.epochs), "--batch-size", str(data_set.batch_size),
               "--seed", str(seed), *args.elastic_flag]  # fmt: skip
    started = time.perf_counter()
    log_path = output + ".log"
    with open(log_path, "w") as log_file:
        log_file.write("$ " + " ".join(command) + "\n")
        log_file.flush()
        try:
            code = subprocess.run(command, cwd=common.REPO, stdout=log_file,
                                  stderr=subprocess.STDOUT, timeout=JOB_TIMEOUT_S,
                                  env=model_env(data_set, data_dir)).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            raise SystemExit(f"{' '.join(command)} took over {JOB_TIMEOUT_S} s") from None
    wall = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"elastic-step train failed with exit status {code}; see {log_path}")
    with open(os.path.join(output, "summary.json")) as f:
        summary = json.load(f)
    value = summary["metrics"][metric_of(data_set)]
    with open(log_path) as f:
        chosen = LOCAL_STEPS.search(f.read())
    local_steps = int(chosen.group(1)) if chosen else None
    common.log(f"elastic {data_set.name} W={workers} seed {seed}: {metric_of(data_set)} "
               f"{value:.4f} ({wall:.1f} s, K={local_steps})")  # fmt: skip
    return {"seed": seed, "workers": workers, "value": value, "wall_s": round(wall, 2),
            "model_version": summary.get("model_version"), "local_steps": local_steps,
            "examples_per_second": summary.get("examples_per_second")}  # fmt: skip


# -- judging --


def spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def judge(data_set: DataSet, validation_records: int, fit: list[float], elastic: list[float]):
    """The comparison of one data set and worker count: means, spreads, gap, and whether
    elastic passes."""
    fit_mean, elastic_mean = statistics.fmean(fit), statistics.fmean(elastic)
    fit_sd, elastic_sd = spread(fit), spread(elastic)
    if data_set.regression:
        mean_ok = elastic_mean <= LOSS_RATIO * fit_mean
        spread_limit = max(SPREAD_POINTS * fit_mean, SPREAD_RATIO * fit_sd)
        gap = elastic_mean / fit_mean
        better = "elastic" if elastic_mean < fit_mean else "fit"
    else:
        allowed = max(ACCURACY_POINTS, 1 / validation_records)
        mean_ok = elastic_mean >= fit_mean - allowed
        spread_limit = max(SPREAD_POINTS, SPREAD_RATIO * fit_sd)
        gap = elastic_mean - fit_mean
        better = "elastic" if elastic_mean > fit_mean else "fit"
    # Seed by seed both sides start from the same values and, on a split with permuted tasks,
    # train the same batches (fit_batches): the per-seed difference is elastic's own.
    paired = [e - f for f, e in zip(fit, elastic, strict=True)]
    return {
        "fit_mean": fit_mean,
        "fit_sd": fit_sd,
        "elastic_mean": elastic_mean,
        "elastic_sd": elastic_sd,
        "gap": gap,
        "gap_kind": "ratio" if data_set.regression else "difference",
        "paired_gap": statistics.fmean(paired),
        "paired_gap_se": spread(paired) / math.sqrt(len(paired)),
        "spread_limit": spread_limit,
        "mean_ok": mean_ok,
        "spread_ok": elastic_sd <= spread_limit,
        "better": better if elastic_mean != fit_mean else "tie",
    }


def validation_records(data_dir: str) -> int:
    with open(os.path.join(data_dir, "schema.json")) as f:
        schema = json.load(f)
    return sum(shard["records"] for shard in schema["splits"]["validation"])


def print_table(results: dict) -> None:
    print()
    print(f"{'data set':<14} {'W':>2}  {'fit mean ± sd':>17}  {'elastic mean ± sd':>17}  "
          f"{'gap':>8}  {'same seed':>16}  {'fit s':>6} {'elastic s':>9}  verdict")  # fmt: skip
    for name, entry in results.items():
        for workers, row in entry["by_workers"].items():
            gap = (f"x{row['gap']:.3f}" if row["gap_kind"] == "ratio"
                   else f"{100 * row['gap']:+.2f}pt")  # fmt: skip
            same_seed = f"{row['paired_gap']:+.4f} ± {row['paired_gap_se']:.4f}"
            verdict = (
                "pass"
                if row["mean_ok"] and row["spread_ok"]
                else ("MISS " + ", ".join(k for k in ("mean", "spread") if not row[f"{k}_ok"]))
            )
            print(
                f"{name:<14} {workers:>2}  {row['fit_mean']:>8.4f} ± {row['fit_sd']:.4f}  "
                f"{row['elastic_mean']:>8.4f} ± {row['elastic_sd']:.4f}  {gap:>8}  "
                f"{same_seed:>16}  "
                f"{row['fit_wall_s']:>6.1f} {row['elastic_wall_s']:>9.1f}  {verdict}"
            )
    print()
    for name, entry in results.items():
        winners = {w: row["better"] for w, row in entry["by_workers"].items()}
        print(f"{name}: better by mean, per worker count: "
              + ", ".join(f"W={w} {who}" for w, who in winners.items()))  # fmt: skip


# -- main --


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Validation quality of `elastic-step train` (default flags) against "
        "Keras model.fit over seeds, data sets and worker counts; prints the table and "
        "writes quality.json.",
    )
    parser.add_argument("--workdir", default=os.path.join(common.HERE, "results", "quality"))
    parser.add_argument(
        "--data-sets",
        default=",".join(DATA_SETS),
        help=f"comma-separated, of {', '.join(DATA_SETS)} (default all)",
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 (default 5)")
    parser.add_argument(
        "--workers",
        type=lambda t: common.distinct_ints(t, minimum=1, what="worker counts"),
        default=[1, 2, 4],
        help="comma-separated worker counts of the elastic runs (default 1,2,4)",
    )
    parser.add_argument(
        "--elastic-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="a flag for every elastic run, e.g. --elastic-flag=--local-steps=1 "
        "(repeatable; default none: the defaults are what is measured)",
    )
    parser.add_argument("--fit-child", metavar="OUT.json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = [n for n in args.data_sets.split(",") if n]
    unknown = [n for n in names if n not in DATA_SETS]
    if unknown or not names:
        parser.error(f"--data-sets: unknown {', '.join(unknown) or '(none)'}; "
                     f"choose from {', '.join(DATA_SETS)}")  # fmt: skip
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, not {args.seeds}")
    args.data_sets = names
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    common.start(args)
    seeds = list(range(args.seeds))
    if args.fit_child:
        data_set = DATA_SETS[args.data_sets[0]]
        fit_child(data_set, os.environ["BENCH_DATA"], seeds, args.fit_child)
        return
    document = {
        **common.run_header(load_before=common.load_average()),
        "settings": {"seeds": seeds, "workers": args.workers, "elastic_flags": args.elastic_flag},
        "data_sets": {},
    }
    path = os.path.join(args.workdir, "quality.json")
    started = time.perf_counter()
    for name in args.data_sets:
        data_set = DATA_SETS[name]
        common.log(f"{name}: {data_set.about}")
        data_dir = prepare(data_set, args.workdir)
        fit = run_fit(args, data_set, data_dir)
        entry = {"about": data_set.about, "metric": metric_of(data_set), "epochs": data_set.epochs,
                 "batch_size": data_set.batch_size, "fit": fit, "elastic": [],
                 "by_workers": {}}  # fmt: skip
        held_out = validation_records(data_dir)
        for workers in args.workers:
            runs = [run_elastic(args, data_set, data_dir, seed, workers) for seed in seeds]
            entry["elastic"] += runs
            row = judge(data_set, held_out, [r["value"] for r in fit], [r["value"] for r in runs])
            row["fit_wall_s"] = statistics.fmean(r["wall_s"] for r in fit)
            row["elastic_wall_s"] = statistics.fmean(r["wall_s"] for r in runs)
            rates = [r["examples_per_second"] for r in runs if r["examples_per_second"]]
            row["elastic_examples_per_second"] = statistics.fmean(rates) if rates else None
            entry["by_workers"][workers] = row
        document["data_sets"][name] = entry
        common.write_result(path, document)  # what finished so far survives an interrupted run
    document["wall_s"] = round(time.perf_counter() - started, 1)
    document["all_pass"] = all(
        row["mean_ok"] and row["spread_ok"]
        for entry in document["data_sets"].values()
        for row in entry["by_workers"].values()
    )
    common.write_result(path, document)
    print_table(document["data_sets"])
    common.log(f"wrote {path} ({document['wall_s']:.0f} s in all)")


if __name__ == "__main__":
    main()
