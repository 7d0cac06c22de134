"""Training throughput: `elastic-step train` (1 worker, 1 PS) against a plain Keras `model.fit`
and against TensorFlow's own ParameterServerStrategy (1 worker, 1 PS).

All run in one invocation, one after the other (never at the same time, so they do not compete
for the cores), on the same model definition (bench/models/mlp.py), the same TFRecord shards
written by the real `elastic-step preprocess`, the same batch size and the same epochs. Each
reports a steady-state rate in examples/s that leaves out a warm-up of the same size: the first
``--records-per-task`` training records, and the validation accuracy after the last epoch.

- elastic: ``examples_per_second`` from OUTPUT/summary.json, which the master computes as the
  records of the 2nd to the last completed training task over the wall time between the end of
  the 1st and the end of the last (so it includes task hand-out, per-task dataset building, and
  the epoch-end evaluation rounds between epochs; see --validation-fraction). One run per
  ``--local-steps`` value.
- keras: a callback notes the time at the end of the training step that completes the first
  ``--records-per-task`` records, and at the end of the last step; the rate is the examples of
  the steps in between over that time (epoch boundaries included, as for the elastic run).

- pss: ``tf.distribute.ParameterServerStrategy`` with a ``ClusterCoordinator``, a worker and a
  PS as in-process ``tf.distribute.Server``s on loopback (in a child process, since it takes
  over TensorFlow's context), a custom training loop (gradient step and the optimizer's update
  in one ``strategy.run``); the time from the end of the warm-up steps to the end of the last.

The ratio elastic / keras is compared with the target of 0.95, elastic / pss with 1.5, and the
validation accuracies of elastic and keras must be within 1 point.
Results go to ``WORKDIR/throughput.json`` (default ``bench/results/``). See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

from common import (
    HERE,
    REPO,
    elastic_step_command,
    load_average,
    log,
    preprocess_once,
    run_header,
    start,
    write_result,
)

from elastic_step.master.config import DEFAULT_LOCAL_STEPS

MODEL_DEF = os.path.join(HERE, "models", "mlp.py")
TARGET = 0.95
TARGET_PSS = 1.5
#: Elastic's validation accuracy must be within this of model.fit's.
ACCURACY_POINTS = 0.01
CLASSES = 10


# -- data --


def write_csv(path: str, rows: int, features: int, seed: int) -> None:
    """``rows`` x ``features`` standard-normal features and a label ``argmax(x @ W + noise)``
    with a fixed random ``W`` (seeded), so the model has something to learn."""
    import numpy as np

    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(features, CLASSES))
    x = rng.normal(size=(rows, features)).astype(np.float32)
    label = np.argmax(x @ weights + 0.5 * rng.normal(size=(rows, CLASSES)), axis=1)
    header = ",".join([*(f"f{i}" for i in range(features)), "label"])
    table = np.concatenate([x, label[:, None].astype(np.float32)], axis=1)
    formats = ["%.5f"] * features + ["%d"]
    np.savetxt(path, table, fmt=formats, delimiter=",", header=header, comments="")


def prepare_data(args, data_dir: str) -> None:
    """Writes the CSV and preprocesses it with the real CLI, unless the same data is there."""

    def write() -> str:
        csv_path = os.path.join(args.workdir, "synthetic.csv")
        log(f"writing {args.rows} rows x {args.features} features to {csv_path}")
        write_csv(csv_path, args.rows, args.features, args.seed)
        return csv_path

    stamp = {
        "rows": args.rows,
        "features": args.features,
        "seed": args.seed,
        "validation_fraction": args.validation_fraction,
        "shards": args.shards,
    }
    flags = ["--label", "label", "--label-type", "class", "--shards", str(args.shards),
             "--validation-fraction", str(args.validation_fraction)]  # fmt: skip
    preprocess_once(data_dir, stamp, write, flags)


# -- run A: elastic-step train --


def run_elastic(args, data_dir: str, local_steps: int, tls: str = "off") -> dict:
    output = os.path.join(args.workdir, f"elastic-run-k{local_steps}-tls-{tls}")
    shutil.rmtree(output, ignore_errors=True)  # a leftover job would be resumed, not rerun
    command = [
        *elastic_step_command(),
        "train",
        "--model-def",
        MODEL_DEF,
        "--data",
        data_dir,
        "--output",
        output,
        "--workers",
        "1",
        "--ps",
        "1",
        "--epochs",
        str(args.epochs),
        "--batch-size",
        str(args.batch_size),
        "--records-per-task",
        str(args.records_per_task),
        "--checkpoint-steps",
        str(args.checkpoint_steps),
        "--seed",
        str(args.seed),
        "--local-steps",
        str(local_steps),
        "--tls",
        tls,
    ]
    log("elastic: " + " ".join(command))
    started = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    for line in process.stdout:
        if args.verbose or any(w in line for w in ("epoch ", "ERROR", "failed", "done:")):
            print("    | " + line.rstrip(), flush=True)
    code = process.wait()
    wall = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"elastic-step train failed with exit status {code}; see {output}")
    with open(os.path.join(output, "summary.json")) as f:
        summary = json.load(f)
    rate = summary.get("examples_per_second")
    if not rate:
        raise SystemExit(f"{output}/summary.json has no examples_per_second: {summary}")
    accuracy = (summary.get("metrics") or {}).get("accuracy")
    log(
        f"elastic K={local_steps} TLS {tls}: {rate:.0f} examples/s (job {wall:.1f}s, "
        f"accuracy {accuracy})"
    )
    return {
        "local_steps": local_steps,
        "tls": tls,
        "examples_per_second": rate,
        "job_wall_s": round(wall, 2),
        "model_version": summary.get("model_version"),
        "validation_accuracy": accuracy,
        "output": output,
        "command": command,
    }


# -- run B: Keras model.fit --


class SteadyRate:
    """A Keras callback: the rate of the training steps after the first ``warmup`` examples."""

    def __init__(self, batch_sizes: list[int], epochs: int, warmup: int, log_fn):
        import keras

        outer = self

        class Callback(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                outer.batch_end(batch)

            def on_epoch_end(self, epoch, logs=None):
                loss = (logs or {}).get("loss")
                log_fn(f"keras: epoch {epoch + 1}/{epochs} done, loss {float(loss):.4f}")

        self.callback = Callback()
        self.batch_sizes = batch_sizes
        self.warmup = warmup
        self.seen = 0
        self.start: float | None = None
        self.end: float | None = None
        self.counted = 0

    def batch_end(self, batch: int) -> None:
        now = time.perf_counter()
        size = self.batch_sizes[batch]
        self.seen += size
        if self.start is None:
            if self.seen >= self.warmup:
                self.start = now
        else:
            self.counted += size
            self.end = now

    def rate(self) -> float:
        if self.start is None or self.end is None or self.end <= self.start:
            raise SystemExit("keras: too few steps after the warm-up to measure a rate")
        return self.counted / (self.end - self.start)


def fit_keras(args, data_dir: str, definition, feed) -> tuple[object, float, float]:
    """``model.fit`` of ``definition``'s model (seeded, compiled with its optimizer and loss)
    on the training shards of ``data_dir``, fed by ``feed``, for ``args.epochs`` epochs:
    the model, its examples/s after the first ``args.records_per_task`` records, and the
    fit's wall time."""
    import keras
    import tensorflow as tf

    from elastic_step.data.schema import Schema

    schema = Schema.load(data_dir)
    shards = schema.shard_paths(data_dir, "train")
    records = sum(n for _, n in shards)
    keras.utils.set_random_seed(args.seed)
    model = definition.build_model()
    model.compile(optimizer=definition.build_optimizer(), loss=definition.loss)

    # Batches cross shard boundaries here (one stream), so only the epoch's last is partial.
    sizes = [args.batch_size] * (records // args.batch_size)
    if records % args.batch_size:
        sizes.append(records % args.batch_size)
    batched = tf.data.TFRecordDataset([path for path, _ in shards]).batch(args.batch_size)
    # The known length lets Keras size its epochs without running off the end of the data.
    batched = batched.apply(tf.data.experimental.assert_cardinality(len(sizes)))
    dataset = feed(batched, "train", schema).prefetch(tf.data.AUTOTUNE)
    meter = SteadyRate(sizes, args.epochs, args.records_per_task, log)
    log(
        f"keras: model.fit on {records} records in {len(shards)} shards, "
        f"{len(sizes)} steps/epoch, {args.epochs} epochs"
    )
    started = time.perf_counter()
    model.fit(dataset, epochs=args.epochs, verbose=0, shuffle=False, callbacks=[meter.callback])
    wall = time.perf_counter() - started
    return model, meter.rate(), wall


def run_keras(args, data_dir: str) -> dict:
    from elastic_step.data.feed import default_feed
    from elastic_step.model.definition import load_model_definition

    model, rate, wall = fit_keras(args, data_dir, load_model_definition(MODEL_DEF), default_feed)
    accuracy = validation_accuracy(model, data_dir, args.batch_size)
    log(f"keras: {rate:.0f} examples/s (fit wall time {wall:.1f}s, accuracy {accuracy:.4f})")
    return {
        "examples_per_second": rate,
        "fit_wall_s": round(wall, 2),
        "validation_accuracy": accuracy,
    }


def validation_accuracy(model, data_dir: str, batch_size: int) -> float:
    """The model's accuracy on the validation split, read as the elastic run's evaluation does."""
    import numpy as np
    import tensorflow as tf

    from elastic_step.data.feed import default_feed
    from elastic_step.data.schema import Schema

    schema = Schema.load(data_dir)
    paths = [path for path, _ in schema.shard_paths(data_dir, "validation")]
    dataset = default_feed(tf.data.TFRecordDataset(paths).batch(batch_size), "evaluate", schema)
    right = total = 0
    for features, labels in dataset:
        predicted = np.argmax(model(features, training=False), axis=-1)
        right += int(np.sum(predicted == labels.numpy()))
        total += len(predicted)
    return right / total


# -- run C: TensorFlow's ParameterServerStrategy --


def run_pss(args, data_dir: str) -> dict:
    """Runs :func:`pss_child` in a child process (it takes over TensorFlow's context)."""
    out = os.path.join(args.workdir, "pss.json")
    command = [sys.executable, os.path.abspath(__file__), "--pss-child", out,
               "--workdir", args.workdir, "--batch-size", str(args.batch_size),
               "--epochs", str(args.epochs), "--records-per-task", str(args.records_per_task),
               "--seed", str(args.seed)]  # fmt: skip
    log("pss: ParameterServerStrategy, 1 worker + 1 PS in-process servers on loopback")
    subprocess.run(command, check=True, cwd=REPO)
    with open(out) as f:
        result = json.load(f)
    log(
        f"pss: {result['examples_per_second']:.0f} examples/s "
        f"(train wall time {result['train_wall_s']:.1f}s, accuracy "
        f"{result['validation_accuracy']:.4f})"
    )
    return result


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pss_child(args, data_dir: str, out: str) -> None:
    import keras
    import tensorflow as tf

    from elastic_step.data.feed import default_feed
    from elastic_step.data.schema import Schema
    from elastic_step.model.definition import load_model_definition

    spec = tf.train.ClusterSpec(
        {"worker": [f"localhost:{_free_port()}"], "ps": [f"localhost:{_free_port()}"]}
    )
    servers = [
        tf.distribute.Server(spec, job_name=job, task_index=0, protocol="grpc", start=True)
        for job in ("worker", "ps")
    ]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    schema = Schema.load(data_dir)
    shards = schema.shard_paths(data_dir, "train")
    records = sum(n for _, n in shards)
    steps_per_epoch = math.ceil(records / args.batch_size)
    definition = load_model_definition(MODEL_DEF)
    keras.utils.set_random_seed(args.seed)
    # The module's own functions: build_model() clears Keras's session, which would take the
    # strategy's scope with it.
    with strategy.scope():
        model = definition.module.model()
        optimizer = definition.module.optimizer()
    loss_fn = definition.loss

    def dataset_fn(context=None):
        batched = tf.data.TFRecordDataset([path for path, _ in shards]).batch(args.batch_size)
        return default_feed(batched, "train", schema).repeat(args.epochs).prefetch(tf.data.AUTOTUNE)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def train_step(iterator):
        def step(features, labels):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(features, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.run(step, args=next(iterator))

    total = steps_per_epoch * args.epochs
    warmup = math.ceil(args.records_per_task / args.batch_size)
    started = time.perf_counter()
    for _ in range(warmup):
        coordinator.schedule(train_step, args=(iterator,))
    coordinator.join()
    measured_from = time.perf_counter()
    for _ in range(total - warmup):
        last = coordinator.schedule(train_step, args=(iterator,))
    coordinator.join()
    ended = time.perf_counter()
    # The steps after the warm-up; the epochs' last batches are partial.
    examples = records * args.epochs - warmup * args.batch_size
    # The trained values, read from the PS into a local model, evaluated like the others'.
    weights = [variable.numpy() for variable in model.weights]
    local = definition.build_model()
    local.set_weights(weights)
    result = {
        "examples_per_second": examples / (ended - measured_from),
        "train_wall_s": round(ended - started, 2),
        "final_loss": float(last.fetch()),
        "validation_accuracy": validation_accuracy(local, data_dir, args.batch_size),
        "steps": total,
        "servers": len(servers),
    }
    with open(out, "w") as f:
        json.dump(result, f)


# -- main --


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Examples/s of `elastic-step train` (1 worker, 1 PS) against a plain "
        "Keras model.fit on the same model, data and batch size; target ratio >= 0.95.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--workdir",
        default=os.path.join(HERE, "results"),
        help="scratch directory: CSV, preprocessed data, the training run, throughput.json",
    )
    parser.add_argument("--rows", type=int, default=100_000, help="rows of synthetic data")
    parser.add_argument("--features", type=int, default=32, help="numeric feature columns")
    parser.add_argument("--hidden", type=int, default=256, help="width of the 2 hidden layers")
    parser.add_argument("--batch-size", type=int, default=256, help="for both runs")
    parser.add_argument("--epochs", type=int, default=2, help="for both runs")
    parser.add_argument(
        "--records-per-task",
        type=int,
        default=4096,
        help="elastic task size; also the warm-up both measurements leave out",
    )
    parser.add_argument(
        "--checkpoint-steps",
        type=int,
        default=0,
        help="PS checkpoint interval of the elastic run (0: none, as model.fit writes none)",
    )
    parser.add_argument(
        "--validation-fraction",
        type=float,
        default=0.02,
        help="held-out fraction; kept small since the elastic run evaluates it at each epoch "
        "end, inside its measured window, and model.fit here does not evaluate",
    )
    parser.add_argument("--shards", type=int, default=4, help="TFRecord shards per split")
    parser.add_argument(
        "--keras-runs",
        type=int,
        default=2,
        help="Keras runs (2: one before and one after the elastic run; the mean is used)",
    )
    parser.add_argument("--seed", type=int, default=0, help="data, split and model seed")
    parser.add_argument(
        "--local-steps",
        default=f"1,{DEFAULT_LOCAL_STEPS}",
        help="comma-separated --local-steps values: one elastic run each; the ratios use the "
        "last (1: a push per step; the default's value is train's default)",
    )
    parser.add_argument(
        "--only",
        choices=["elastic", "keras", "pss"],
        help="run just one side (no ratio is printed)",
    )
    parser.add_argument(
        "--tls-cost",
        action="store_true",
        help="run each elastic run again with --tls on (mutual TLS between master, worker "
        "and PS), right after the one without, and print the ratio with / without",
    )
    parser.add_argument("--pss-child", metavar="OUT.json", help=argparse.SUPPRESS)
    parser.add_argument("-v", "--verbose", action="store_true", help="show all training logs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start(args)
    # The model definition reads its shape from these; the training processes inherit them.
    os.environ["BENCH_FEATURES"] = str(args.features)
    os.environ["BENCH_HIDDEN"] = str(args.hidden)
    os.environ["BENCH_CLASSES"] = str(CLASSES)
    if args.pss_child:
        pss_child(args, os.path.join(args.workdir, "data"), args.pss_child)
        return 0
    local_steps = [int(k) for k in args.local_steps.split(",")]

    load_before = load_average()
    log(f"load average before: {load_before} ({os.cpu_count()} CPUs)")
    data_dir = os.path.join(args.workdir, "data")
    prepare_data(args, data_dir)

    # The Keras run is short, so it runs before AND after the elastic one (--keras-runs 2):
    # their mean is less at the mercy of load that comes and goes on a shared machine.
    results: dict = {}
    loads: dict = {}
    keras_runs: list[dict] = []
    run_keras_side = args.only in (None, "keras")
    if run_keras_side and args.keras_runs >= 2:
        keras_runs.append(run_keras(args, data_dir))
        loads["after_keras_1"] = load_average()
    if args.only in (None, "pss"):
        results["pss"] = run_pss(args, data_dir)
        loads["after_pss"] = load_average()
    if args.only in (None, "elastic"):
        results["elastic_runs"] = []
        for k in local_steps:
            results["elastic_runs"].append(run_elastic(args, data_dir, k))
            loads[f"after_elastic_k{k}"] = load_average()
            if args.tls_cost:
                results.setdefault("elastic_tls_runs", []).append(
                    run_elastic(args, data_dir, k, tls="on")
                )
                loads[f"after_elastic_k{k}_tls"] = load_average()
        results["elastic"] = results["elastic_runs"][-1]
    while run_keras_side and len(keras_runs) < max(1, args.keras_runs):
        keras_runs.append(run_keras(args, data_dir))
        loads[f"after_keras_{len(keras_runs)}"] = load_average()
    if keras_runs:
        rates = [r["examples_per_second"] for r in keras_runs]
        results["keras"] = {"examples_per_second": sum(rates) / len(rates), "runs": keras_runs}

    ratio = ratio_pss = None
    if "elastic" in results and "keras" in results:
        ratio = results["elastic"]["examples_per_second"] / results["keras"]["examples_per_second"]
    if "elastic" in results and "pss" in results:
        ratio_pss = (
            results["elastic"]["examples_per_second"] / results["pss"]["examples_per_second"]
        )

    document = {
        **run_header(
            load_average_before=load_before,
            **{f"load_average_{k}": v for k, v in loads.items()},
        ),
        "settings": {
            k: getattr(args, k)
            for k in (
                "rows",
                "features",
                "hidden",
                "batch_size",
                "epochs",
                "records_per_task",
                "checkpoint_steps",
                "validation_fraction",
                "shards",
                "seed",
            )
        },
        "results": results,
        "ratio": ratio,
        "ratio_pss": ratio_pss,
        "target": TARGET,
        "meets_target": None if ratio is None else ratio >= TARGET,
    }
    out_path = os.path.join(args.workdir, "throughput.json")
    write_result(out_path, document)

    print()
    print(f"{'run':<40}{'examples/s':>12}{'val. accuracy':>15}")

    def row(name: str, result: dict, detail: str = "") -> None:
        accuracy = result.get("validation_accuracy")
        shown = f"{accuracy:>15.4f}" if accuracy is not None else f"{'-':>15}"
        print(f"{name:<40}{result['examples_per_second']:>12.0f}{shown}{detail}")

    for run in results.get("elastic_runs", []):
        row(f"elastic-step train, K={run['local_steps']} (1 w, 1 PS)", run)
    tls_runs = results.get("elastic_tls_runs", [])
    for plain, tls in zip(results.get("elastic_runs", [])[: len(tls_runs)], tls_runs, strict=True):
        row(f"  ... with mutual TLS, K={tls['local_steps']}", tls)
        tls_ratio = tls["examples_per_second"] / plain["examples_per_second"]
        label = f"  ratio TLS / plain, K={tls['local_steps']}"
        print(f"{label:<40}{tls_ratio:>12.3f}")
    if "pss" in results:
        row("TF ParameterServerStrategy (1 w, 1 PS)", results["pss"])
    if "keras" in results:
        runs = results["keras"]["runs"]
        detail = ""
        if len(runs) > 1:
            detail = (
                "   (mean of " + ", ".join(f"{r['examples_per_second']:.0f}" for r in runs) + ")"
            )
        accuracies = [r["validation_accuracy"] for r in runs]
        keras_row = {**results["keras"], "validation_accuracy": sum(accuracies) / len(accuracies)}
        row("keras model.fit", keras_row, detail)
    k = results["elastic"]["local_steps"] if "elastic" in results else None
    if ratio is not None and math.isfinite(ratio):
        verdict = "PASS" if ratio >= TARGET else "BELOW"
        print(
            f"{f'ratio elastic (K={k}) / keras':<40}{ratio:>12.3f}   target >= {TARGET}: {verdict}"
        )
    if ratio_pss is not None and math.isfinite(ratio_pss):
        verdict = "PASS" if ratio_pss >= TARGET_PSS else "BELOW"
        print(
            f"{f'ratio elastic (K={k}) / pss':<40}{ratio_pss:>12.3f}   "
            f"target >= {TARGET_PSS}: {verdict}"
        )
    if "elastic" in results and "keras" in results:
        runs = results["keras"]["runs"]
        keras_accuracy = sum(r["validation_accuracy"] for r in runs) / len(runs)
        gap = results["elastic"]["validation_accuracy"] - keras_accuracy
        # Rounded to the accuracy's own resolution (1 / validation records) before judging.
        verdict = "PASS" if round(abs(gap), 6) <= ACCURACY_POINTS else "BELOW"
        print(
            f"{f'accuracy elastic (K={k}) - keras':<40}{gap:>+12.4f}   "
            f"target within {ACCURACY_POINTS}: {verdict}"
        )
    print(f"load average: before {load_before}; " + "; ".join(f"{k} {v}" for k, v in loads.items()))
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
