"""Data order alone: bench/quality.py's model trained in one process, batch by batch, in the
order `model.fit` feeds it and in the order an elastic job's tasks do, with no PS and no
asynchrony, so that what the order does to the model shows apart from the rest.

For a data set of bench/quality.py (preprocessed the same way, into the same work directory)
and each seed, the model (bench/models/tabular.py, seeded as both sides of that bench seed it)
is trained with Keras ``train_on_batch`` for the data set's epochs and batch size, in each
order asked for:

- ``fit``: every training record shuffled each epoch, then cut into batches, as
  ``model.fit`` on a shuffled dataset does;
- ``ranges``: the master's tasks as it cuts them from a training split of more than 16,384
  records (``elastic_step.master.tasks.task_size``, the size it chooses with every flag at its
  default): ranges of a shard, their order shuffled each epoch and each task's records
  shuffled among themselves and cut into batches, as the master and a worker do. Until
  permuted tasks came, on every split;
- ``shards``: the same task sizes, cut from each shard's records permuted anew each epoch;
- ``split``: the same task sizes, cut from the whole split's records permuted anew each
  epoch and taken in position order, as a job trains a split of at most 16,384 records since
  permuted tasks came (``task_size.permuted_training_tasks``).

It prints each order's mean and standard deviation of the validation metric (accuracy, or
the MSE for a regression) over the seeds, with every seed's value, and writes
``WORKDIR/data_order.json``. A study, not a test: see bench/README.md ("Diabetes over 20
seeds"); tests/e2e/test_quality_bench.py runs it small.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import common
import quality

ORDERS = ("fit", "ranges", "shards", "split")


def batches_of_epoch(order: str, shards: list[int], batch_size: int, records_per_task: int,
                     rng) -> list[tuple[int, list[int]]]:  # fmt: skip
    """An epoch's batches as (shard, positions of its records in that shard), in training
    order; ``shards`` holds each shard's record count. For ``fit`` and ``split`` the shard is
    -1 and the positions count over the shards joined."""
    if order == "fit":
        positions = rng.permutation(sum(shards))
        return [(-1, list(positions[i : i + batch_size])) for i in range(0, len(positions),
                                                                          batch_size)]  # fmt: skip
    if order == "split":
        runs = [(-1, rng.permutation(sum(shards)))]
    else:
        runs = [(shard, rng.permutation(records) if order == "shards" else range(records))
                for shard, records in enumerate(shards)]  # fmt: skip
    tasks = [(shard, list(positions[start : start + records_per_task]))
             for shard, positions in runs
             for start in range(0, len(positions), records_per_task)]  # fmt: skip
    batches = []
    # the master hands permuted tasks out in position order, ranges of shards shuffled
    for at in range(len(tasks)) if order == "split" else rng.permutation(len(tasks)):
        shard, positions = tasks[at]
        positions = list(rng.permutation(positions))  # a worker shuffles a task's records
        batches += [(shard, positions[i : i + batch_size])
                    for i in range(0, len(positions), batch_size)]  # fmt: skip
    return batches


def load_split(definition, schema, data_dir: str, split: str) -> list[tuple[dict, object]]:
    """Each shard of ``split`` fed by the model's feed, as (features, labels) arrays."""
    import tensorflow as tf

    mode = "train" if split == "train" else "evaluate"
    out = []
    for path, records in schema.shard_paths(data_dir, split):
        batch = tf.data.TFRecordDataset([path]).batch(max(records, 1))
        features, labels = next(iter(definition.feed(batch, mode, schema)))
        out.append(({k: v.numpy() for k, v in features.items()}, labels.numpy()))
    return out


def joined(parts: list[tuple[dict, object]]) -> tuple[dict, object]:
    import numpy as np

    features = {k: np.concatenate([p[0][k] for p in parts]) for k in parts[0][0]}
    return features, np.concatenate([p[1] for p in parts])


class Study:
    """A data set's model definition and its records, fed and held in memory once, for every
    seed and order."""

    def __init__(self, data_set: quality.DataSet, data_dir: str) -> None:
        from elastic_step.data.schema import Schema
        from elastic_step.model.definition import load_model_definition

        self.data_set = data_set
        schema = Schema.load(data_dir)
        self.definition = load_model_definition(os.path.join(quality.MODELS, data_set.model),
                                                schema)  # fmt: skip
        self.definition.build_model()  # the default feed is the built model's
        self.shards = load_split(self.definition, schema, data_dir, "train")
        self.every = joined(self.shards)
        self.validation = joined(load_split(self.definition, schema, data_dir, "validation"))
        self.counts = [len(labels) for _, labels in self.shards]

    def train_once(self, order: str, seed: int, records_per_task: int = 0) -> float:
        """One seed's model trained in ``order``, in tasks of ``records_per_task`` records
        (0: the master's choice); its validation metric."""
        import keras
        import numpy as np

        from elastic_step.master.tasks.task_size import training_records_per_task

        data_set = self.data_set
        keras.utils.set_random_seed(seed)
        model = self.definition.build_model()
        metrics = self.definition.build_metrics()
        model.compile(optimizer=self.definition.build_optimizer(), loss=self.definition.loss,
                      metrics=list(metrics.values()))  # fmt: skip
        per_task = training_records_per_task(records_per_task, train_records=sum(self.counts),
                                             batch_size=data_set.batch_size)  # fmt: skip
        rng = np.random.default_rng(seed)
        for _ in range(data_set.epochs):
            for shard, positions in batches_of_epoch(order, self.counts, data_set.batch_size,
                                                     per_task, rng):  # fmt: skip
                features, labels = self.every if shard == -1 else self.shards[shard]
                model.train_on_batch({k: v[positions] for k, v in features.items()},
                                     labels[positions])  # fmt: skip
        result = model.evaluate(*self.validation, verbose=0, batch_size=256, return_dict=True)
        return float(result["loss"] if data_set.regression else metrics["accuracy"].result())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="bench/quality.py's model trained in one process in model.fit's data "
        "order and in an elastic job's (its tasks: ranges, or permuted), no PS: the "
        "validation metric over seeds for each order; writes data_order.json."
    )
    parser.add_argument("--workdir", default=os.path.join(common.HERE, "results", "quality"),
                        help="where bench/quality.py keeps its data (shared with it)")  # fmt: skip
    parser.add_argument("--data-set", default="diabetes", choices=sorted(quality.DATA_SETS))
    parser.add_argument("--seeds", type=int, default=20, help="seeds 0..N-1 (default 20)")
    parser.add_argument("--orders", default=",".join(ORDERS),
                        help=f"comma-separated, of {', '.join(ORDERS)} (default all)")  # fmt: skip
    parser.add_argument("--records-per-task", type=int, default=0,
                        help="the tasks' size, as train's (default 0: the master's)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.records_per_task < 0:
        parser.error(f"--records-per-task must be >= 0, not {args.records_per_task}")
    args.orders = [o for o in args.orders.split(",") if o]
    unknown = [o for o in args.orders if o not in ORDERS]
    if unknown or not args.orders:
        parser.error(f"--orders: unknown {', '.join(unknown) or '(none)'}; "
                     f"choose from {', '.join(ORDERS)}")  # fmt: skip
    if args.seeds < 2:
        parser.error(f"--seeds must be at least 2 (a spread needs two), not {args.seeds}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    common.start(args)
    data_set = quality.DATA_SETS[args.data_set]
    data_dir = quality.prepare(data_set, args.workdir)
    os.environ["BENCH_DATA"] = data_dir  # the model file reads its schema from there
    os.environ.update(data_set.env)
    document = {**common.run_header(load_before=common.load_average()),
                "data_set": args.data_set, "metric": quality.metric_of(data_set),
                "seeds": args.seeds, "records_per_task": args.records_per_task,
                "orders": {}}  # fmt: skip
    started = time.perf_counter()
    study = Study(data_set, data_dir)
    for order in args.orders:
        values = [study.train_once(order, seed, args.records_per_task)
                  for seed in range(args.seeds)]  # fmt: skip
        mean, spread = statistics.fmean(values), statistics.stdev(values)
        document["orders"][order] = {"mean": mean, "sd": spread, "values": values}
        print(f"{order:9} {quality.metric_of(data_set)} {mean:.4f} ± {spread:.4f}   "
              + " ".join(f"{v:.3f}" for v in values), flush=True)  # fmt: skip
    document["wall_s"] = round(time.perf_counter() - started, 1)
    common.write_result(os.path.join(args.workdir, "data_order.json"), document)


if __name__ == "__main__":
    main()
