"""Embedding traffic: a wide-and-deep model with a 1,000,000 x 16 table over a Zipf id column,
`elastic-step train` (1 worker, 1 PS) against a plain Keras `model.fit`.

Both run in one invocation, one after the other, on the same model definition
(bench/models/wide_deep.py), the same TFRecord shards written by the real `elastic-step
preprocess`, the same batch size and epochs. Reported for each: examples/s in the steady state
(the first ``--records-per-task`` records left out, as in bench/throughput.py), validation
accuracy, and for the elastic runs the bytes a worker sent and received per training step
(serialized gRPC messages, counted by its PS client), against the bytes of the table itself:
what a step would move if tables travelled whole. Results go to ``WORKDIR/embedding.json``
(default ``bench/results/embedding/``). See bench/README.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

import common
from throughput import fit_keras, k_label

from elastic_step.master.config import DEFAULT_LOCAL_STEPS

MODEL_DEF = os.path.join(common.HERE, "models", "wide_deep.py")
TARGET_BYTES_RATIO = 100
TRAFFIC = re.compile(
    r"PS traffic: (\d+) training steps, (\d+) calls, (\d+) bytes sent, (\d+) bytes received"
)


def write_csv(path: str, args) -> None:
    """``item``: Zipf-distributed ids spread over the table by a fixed permutation; numeric
    ``f*``; label: a hidden bit of the item plus a linear signal in the numeric columns."""
    import numpy as np

    rng = np.random.default_rng(args.seed)
    rank = (rng.zipf(args.zipf, args.rows) - 1) % args.table_rows
    item = (rank * 7_919 + 13) % args.table_rows  # hot ids not all next to each other
    x = rng.normal(size=(args.rows, args.features)).astype(np.float32)
    item_bit = ((item * 2_654_435_761) >> 7) & 1
    logit = 2.0 * (item_bit - 0.5) + x @ rng.normal(size=args.features) * 0.5
    label = (logit + 0.5 * rng.normal(size=args.rows) > 0).astype(int)
    header = ",".join(["item", *(f"f{i}" for i in range(args.features)), "label"])
    table = np.column_stack([item, x, label])
    formats = ["%d"] + ["%.5f"] * args.features + ["%d"]
    np.savetxt(path, table, fmt=formats, delimiter=",", header=header, comments="")


def prepare_data(args, data_dir: str) -> None:
    def write() -> str:
        csv_path = os.path.join(args.workdir, "items.csv")
        common.log(
            f"writing {args.rows} rows (Zipf {args.zipf} over {args.table_rows} ids) to {csv_path}"
        )
        write_csv(csv_path, args)
        return csv_path

    stamp = {k: getattr(args, k) for k in ("rows", "table_rows", "features", "zipf", "seed")}
    flags = ["--label", "label", "--label-type", "class", "--shards", "4",
             "--validation-fraction", "0.05"]  # fmt: skip
    common.preprocess_once(data_dir, stamp, write, flags)


def distinct_ids_per_batch(data_dir: str, batch_size: int) -> float:
    """The mean number of distinct ids in a training batch: what a sparse step must move."""
    import numpy as np

    with open(os.path.join(os.path.dirname(data_dir), "items.csv")) as f:
        next(f)
        items = np.array([int(line.split(",", 1)[0]) for line in f])
    sizes = [len(np.unique(items[i : i + batch_size])) for i in range(0, len(items), batch_size)]
    return float(np.mean(sizes))


def run_elastic(args, data_dir: str, local_steps: int) -> dict:
    output = os.path.join(args.workdir, f"elastic-run-k{local_steps}")
    shutil.rmtree(output, ignore_errors=True)
    command = [*common.elastic_step_command(), "train", "--model-def", MODEL_DEF,
               "--data", data_dir, "--output", output, "--workers", "1", "--ps", "1",
               "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
               "--records-per-task", str(args.records_per_task), "--checkpoint-steps", "0",
               "--seed", str(args.seed), "--local-steps", str(local_steps)]  # fmt: skip
    common.log("elastic: " + " ".join(command))
    started = time.perf_counter()
    result = subprocess.run(command, cwd=common.REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"train failed ({result.returncode}):\n{result.stderr[-3000:]}")
    with open(os.path.join(output, "summary.json")) as f:
        summary = json.load(f)
    steps = calls = sent = received = 0
    for path in glob.glob(os.path.join(output, "backend", "logs", "worker-*.log")):
        with open(path) as f:
            for match in TRAFFIC.finditer(f.read()):
                s, c, out, back = map(int, match.groups())
                steps, calls, sent, received = steps + s, calls + c, sent + out, received + back
    if not steps:
        raise SystemExit(f"no PS traffic line in the worker logs of {output}")
    rate = summary["examples_per_second"]
    per_step = (sent + received) / steps
    accuracy = summary["metrics"]["accuracy"]
    common.log(
        f"elastic K={k_label(local_steps)}: {rate:.0f} examples/s, "
        f"{per_step / 1e3:.1f} KB per step, accuracy {accuracy:.4f} (job {wall:.1f}s)"
    )
    return {
        "local_steps": local_steps,
        "examples_per_second": rate,
        "validation_accuracy": accuracy,
        "training_steps": steps,
        "calls": calls,
        "bytes_sent": sent,
        "bytes_received": received,
        "bytes_per_step": per_step,
        "job_wall_s": round(wall, 2),
    }


def run_keras(args, data_dir: str) -> dict:
    import numpy as np
    import tensorflow as tf

    from elastic_step.data.schema import Schema
    from elastic_step.model.definition import load_model_definition

    definition = load_model_definition(MODEL_DEF)
    model, rate, wall = fit_keras(args, data_dir, definition, definition.feed)
    schema = Schema.load(data_dir)
    paths = [path for path, _ in schema.shard_paths(data_dir, "validation")]
    right = total = 0
    validation = tf.data.TFRecordDataset(paths).batch(args.batch_size)
    for features, labels in definition.feed(validation, "evaluate", schema):
        predicted = model(features, training=False).numpy()[:, 0] > 0
        right += int(np.sum(predicted == labels.numpy().astype(bool)))
        total += len(predicted)
    common.log(f"keras: {rate:.0f} examples/s (fit {wall:.1f}s, accuracy {right / total:.4f})")
    return {
        "examples_per_second": rate,
        "fit_wall_s": round(wall, 2),
        "validation_accuracy": right / total,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Examples/s and PS bytes per step of `elastic-step train` (1 worker, 1 PS) "
        "on a wide-and-deep model with a 1,000,000 x 16 embedding over a Zipf id column, "
        "against model.fit; target: bytes per step >= 100x below the table's size.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--workdir", default=os.path.join(common.HERE, "results", "embedding"))
    parser.add_argument("--rows", type=int, default=100_000, help="examples of synthetic data")
    parser.add_argument("--table-rows", type=int, default=1_000_000, help="embedding rows")
    parser.add_argument("--dim", type=int, default=16, help="embedding width")
    parser.add_argument("--features", type=int, default=8, help="numeric columns")
    parser.add_argument("--zipf", type=float, default=1.2, help="Zipf exponent of the ids")
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--records-per-task", type=int, default=4096)
    parser.add_argument(
        "--local-steps",
        default=f"1,{DEFAULT_LOCAL_STEPS}",
        help="comma-separated --local-steps values: one elastic run each",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=["elastic", "keras"], help="run just one side")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common.start(args)
    os.environ["BENCH_TABLE_ROWS"] = str(args.table_rows)
    os.environ["BENCH_TABLE_DIM"] = str(args.dim)
    os.environ["BENCH_FEATURES"] = str(args.features)
    os.environ["BENCH_OPTIMIZER"] = args.optimizer
    loads = {"before": common.load_average()}
    common.log(f"load average before: {loads['before']} ({os.cpu_count()} CPUs)")
    data_dir = os.path.join(args.workdir, "data")
    prepare_data(args, data_dir)
    distinct = distinct_ids_per_batch(data_dir, args.batch_size)
    table_bytes = args.table_rows * args.dim * 4
    common.log(f"{distinct:.0f} distinct ids per batch of {args.batch_size} on average")

    results: dict = {}
    if args.only in (None, "keras"):
        results["keras"] = run_keras(args, data_dir)
        loads["after_keras"] = common.load_average()
    if args.only in (None, "elastic"):
        results["elastic_runs"] = []
        for k in (int(k) for k in args.local_steps.split(",")):
            results["elastic_runs"].append(run_elastic(args, data_dir, k))
            loads[f"after_elastic_k{k}"] = common.load_average()

    document = {
        **common.run_header(load=loads),
        "settings": vars(args),
        "table_bytes": table_bytes,
        "distinct_ids_per_batch": distinct,
        "results": results,
    }
    out_path = os.path.join(args.workdir, "embedding.json")
    common.write_result(out_path, document)

    print()
    print(f"table: {args.table_rows} x {args.dim} float32 = {table_bytes / 1e6:.1f} MB; "
          f"{distinct:.0f} distinct ids per batch")  # fmt: skip
    print(f"{'run':<32}{'examples/s':>12}{'val. acc.':>11}{'KB/step':>10}{'table / step':>14}")
    keras_rate = results.get("keras", {}).get("examples_per_second")
    if "keras" in results:
        r = results["keras"]
        print(f"{'keras model.fit':<32}{r['examples_per_second']:>12.0f}"
              f"{r['validation_accuracy']:>11.4f}{'-':>10}{'-':>14}")  # fmt: skip
    for r in results.get("elastic_runs", []):
        ratio = table_bytes / r["bytes_per_step"]
        verdict = "PASS" if ratio >= TARGET_BYTES_RATIO else "BELOW"
        name = f"elastic-step train, K={k_label(r['local_steps'])}"
        print(f"{name:<32}{r['examples_per_second']:>12.0f}{r['validation_accuracy']:>11.4f}"
              f"{r['bytes_per_step'] / 1e3:>10.1f}{ratio:>13.0f}x   "
              f"target >= {TARGET_BYTES_RATIO}x: {verdict}")  # fmt: skip
        if keras_rate:
            speed = r["examples_per_second"] / keras_rate
            print(f"{'  examples/s, elastic / keras':<32}{speed:>12.3f}")
    print("load average: " + "; ".join(f"{k} {v}" for k, v in loads.items()))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
