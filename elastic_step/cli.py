"""The ``elastic-step`` command."""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import sys
from collections.abc import Callable
from typing import TypeVar

from elastic_step import __version__
from elastic_step.backends import backend_names
from elastic_step.backends.local import LocalOptions
from elastic_step.errors import ElasticStepError, InputError
from elastic_step.kubernetes_flags import (
    add_kubernetes_flags,
    kubernetes_flags_given,
    options_from_args,
)
from elastic_step.model.tf_runtime import import_tensorflow_quietly
from elastic_step.process_memory import configure_master_memory

log = logging.getLogger("elastic_step")
T = TypeVar("T")

#: The exit status of a command whose stdout's reader went away (``... | head``): a shell's
#: for a process killed by SIGPIPE (128 + 13), which `cat` or `grep` give there, so that
#: `set -o pipefail` sees it as it does for them. Not 0: the output was cut short. Not death
#: by SIGPIPE itself (SIG_DFL), which Python's docs advise against: a write to any closed
#: socket (the master's gRPC) would then kill the process too.
BROKEN_PIPE_EXIT = 141

DESCRIPTION = """\
Elastic, fault-tolerant TensorFlow 2 training as one pipeline step.

  elastic-step preprocess --input data.csv --label y --output data/
  elastic-step train --model-def model.py --data data/ --output run/ --workers 2 --ps 1
  elastic-step evaluate --model run/ --data data/ --metrics-output metrics.json
  elastic-step predict --model run/ --input new.csv --output predictions/ --workers 2
  elastic-step status run/
  elastic-step demo
"""


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'") from None


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")
    return text.lower() == "true"


#: A switch: ``--flag`` alone, or ``--flag true|false``, the form that a pipeline engine
#: passes (an Argo template cannot leave a flag out, only give it a value).
_SWITCH = {"nargs": "?", "const": True, "default": False, "type": _bool, "metavar": "true|false"}


def _unless_empty(convert: Callable[[str], T]) -> Callable[[str], T | None]:
    """A flag's type under which an empty value means the flag left out (its default None):
    an Argo template passes every parameter, set or not."""

    def read(text: str) -> T | None:
        return None if text == "" else convert(text)

    return read


def _add_preprocess(commands) -> None:
    p = commands.add_parser(
        "preprocess",
        help="turn a CSV file or Parquet files into sharded TFRecord data with a schema",
        description="Reads a CSV file with a header row, or Parquet files, and writes "
        "DIR/train/, DIR/validation/ (TFRecord shards with offset indexes), "
        "DIR/vocabularies/ and DIR/schema.json. A CSV file's column types come from its first "
        "100 rows: a column whose values there are all numbers is numeric; one with more "
        "than half numbers but not all is an error (a stray word in a numeric column), "
        "unless --categorical names it; any other is categorical. Parquet's come from its "
        "schema: numbers are numeric, strings and booleans categorical. A categorical column "
        "with nearly as many values as rows is reported as probably an id column. The input "
        "is streamed: memory stays bounded at any size.",
    )
    p.add_argument(
        "--input",
        required=True,
        metavar="INPUT",
        help="a CSV file with a header row, gzip-compressed or not; or Parquet: a *.parquet "
        "file, a directory of them, or a glob (DIR/part-*.parquet), whose schema gives the "
        "column types; a path or URI (s3://, gs://, ...)",
    )
    p.add_argument("--label", required=True, metavar="COLUMN", help="the label column")
    p.add_argument("--output", required=True, metavar="DIR", help="where to write the data")
    p.add_argument(
        "--shards", type=_int, metavar="N", default=4, help="shards per split (default 4)"
    )
    p.add_argument(
        "--validation-fraction",
        type=float,
        default=0.2,
        metavar="F",
        help="fraction of rows held out for validation (default 0.2)",
    )
    p.add_argument(
        "--seed", type=_int, metavar="N", default=0, help="seed of the split (default 0)"
    )
    p.add_argument(
        "--categorical",
        default="",
        metavar="COLS",
        help="comma-separated columns to treat as categorical even if they look numeric",
    )
    p.add_argument(
        "--label-type",
        choices=["auto", "class", "numeric"],
        default="auto",
        help="auto: integer labels with at most 50 values, and text labels, are classes",
    )
    p.add_argument(
        "--fill-missing",
        metavar="mean|zero|VALUE",
        default=None,
        type=_unless_empty(str),
        help="allow empty values in numeric columns and read them as the train split's mean, "
        "0, or VALUE (recorded in schema.json; default: an empty numeric value is an error)",
    )
    p.add_argument(
        "--one-hot",
        **_SWITCH,
        help="the default feed gives categorical columns as one-hot vectors (a float per "
        "id) instead of ids",
    )
    p.add_argument(
        "--max-vocabulary",
        type=_int,
        metavar="N",
        default=0,
        help="at most the N most frequent values of each categorical column get ids of their "
        "own, ties broken by value (default 0: every value)",
    )
    p.add_argument(
        "--min-frequency",
        type=_int,
        metavar="N",
        default=1,
        help="only values seen at least N times get ids of their own (default 1)",
    )
    p.add_argument(
        "--oov-buckets",
        type=_int,
        metavar="N",
        default=1,
        help="ids shared by the values that are not in a vocabulary (unseen or left out), "
        "each value hashed to one of them, the same in every process (default 1)",
    )
    p.add_argument(
        "--hash-buckets",
        default="",
        metavar="COL=N,...",
        help="categorical columns without a vocabulary, such as ids: each value hashed to "
        "one of N ids, comma-separated: --hash-buckets user=2000000,item=500000",
    )
    p.add_argument(
        "--runner",
        choices=["local", "beam"],
        default="local",
        help="local: in this process (default); beam: as an Apache Beam pipeline, on the Beam "
        "runner that --beam-option names (default: Beam's local runner), with the same "
        "output (needs elastic-step[beam])",
    )
    p.add_argument(
        "--beam-option",
        action="append",
        default=[],
        metavar="OPT",
        help="an option of the Beam pipeline (--runner beam), repeated for each, with '=': "
        "--beam-option=--runner=DataflowRunner --beam-option=--project=P",
    )


def _add_train(commands) -> None:
    from elastic_step.master.config import DEFAULT_LOCAL_STEPS
    from elastic_step.model.outer_optimizer import OUTER_OPTIMIZERS

    p = commands.add_parser(
        "train",
        help="run elastic, fault-tolerant training (the master runs in this process)",
        description="Runs the master in this process; it starts the PS and workers, replaces "
        "any that die, and writes the model, summary.json and status.json to --output. "
        "Running the same command again on the same --output resumes an interrupted job.",
    )
    p.add_argument("--model-def", required=True, metavar="FILE.py", help="the model definition")
    p.add_argument("--data", required=True, metavar="DIR", help="what `preprocess` wrote")
    p.add_argument("--output", required=True, metavar="DIR", help="model, summary and state")
    _add_summary_output(p)
    p.add_argument("--epochs", type=_int, metavar="N", default=1, help="(default 1)")
    p.add_argument("--batch-size", type=_int, metavar="N", default=64, help="(default 64)")
    p.add_argument(
        "--ps", type=_int, metavar="N", default=1, help="parameter server shards (default 1)"
    )
    p.add_argument("--seed", type=_int, metavar="N", default=0, help="(default 0)")
    p.add_argument(
        "--evaluation-steps",
        type=_int,
        metavar="N",
        default=0,
        help="also evaluate every N model versions (default 0: at epoch ends only)",
    )
    p.add_argument(
        "--checkpoint-steps",
        type=_int,
        metavar="N",
        default=200,
        help="PS checkpoints (default 200)",
    )
    p.add_argument("--keep-checkpoints", type=_int, metavar="N", default=3, help="(default 3)")
    p.add_argument(
        "--staleness-modulation",
        **{**_SWITCH, "default": True},
        help="divide the PS's learning rate by the staleness of each gradient (the updates "
        "applied since its worker pulled), where workers push gradients (--local-steps 1) "
        "and the rate is a constant (default true)",
    )
    p.add_argument(
        "--local-steps",
        type=_int,
        metavar="K",
        default=DEFAULT_LOCAL_STEPS,
        help="steps a worker runs on its own copy of the model, with its own optimizer, "
        "before it pushes the change and pulls fresh parameters; 1 pushes every gradient to "
        "the PS's optimizer; 16 is as fast as model.fit on small models but can cost accuracy "
        "when an epoch has few steps per worker (default "
        f"{DEFAULT_LOCAL_STEPS}: chosen by the master, up to 16, so that each worker pushes "
        "at least 8 times an epoch)",
    )
    p.add_argument(
        "--outer-optimizer",
        choices=OUTER_OPTIMIZERS,
        default="average",
        help="how the PS applies a worker's change with --local-steps > 1: average (add it, "
        "outer SGD with learning rate 1) or nesterov (DiLoCo's outer Nesterov momentum) "
        "(default average)",
    )
    p.add_argument(
        "--early-stopping",
        metavar="METRIC[:PATIENCE[:min|max]]",
        default=None,
        type=_unless_empty(str),
        help="end training after the epoch under way once PATIENCE evaluation rounds in a "
        "row (default 2) have not beaten the best; METRIC is loss or a name from the model "
        "definition's metrics(); min or max says which way is better (default: max for "
        "names with acc, auc, precision, recall or f1, else min)",
    )
    p.add_argument(
        "--keep-best",
        metavar="METRIC[:min|max]",
        default=None,
        type=_unless_empty(str),
        help="save the model of the best evaluation round instead of the last; each round "
        "then runs with training paused, so that it measures one model",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="with --backend kubernetes: print, as YAML, every object the master would create "
        "at the start, and exit without contacting a cluster",
    )
    g = p.add_argument_group("MLflow")
    g.add_argument(
        "--mlflow-tracking-uri",
        metavar="URI",
        default=None,
        type=_unless_empty(str),
        help="log the job's params, loss and metrics by model version, live workers, "
        "restarts, summary, report and model to an MLflow run at this tracking server "
        "(default: $MLFLOW_TRACKING_URI; KFP's MLFLOW_RUN_ID or KFP_MLFLOW_CONFIG, when set, "
        "name the run; none of them: no MLflow). A server that is away never stops the job",
    )
    g.add_argument(
        "--mlflow-experiment",
        metavar="NAME",
        default=None,
        type=_unless_empty(str),
        help="the experiment of the job's run (default: $MLFLOW_EXPERIMENT_ID or "
        "$MLFLOW_EXPERIMENT_NAME, else elastic-step)",
    )
    _add_job_flags(p, ps=True)


def _add_job_flags(p: argparse.ArgumentParser, *, ps: bool) -> None:
    """The flags of an elastic job, training or prediction: its members, its limits, where
    it runs and how it is named. ``ps``: the job has PS (training), with flags of their own."""
    members = "workers and PS" if ps else "workers"
    g = p.add_argument_group("the elastic job")
    g.add_argument(
        "--workers", type=_int, metavar="N", default=2, help="workers to start (default 2)"
    )
    g.add_argument(
        "--min-workers", type=_int, metavar="N", default=1, help="fail below this many (default 1)"
    )
    g.add_argument(
        "--max-workers",
        type=_int,
        metavar="N",
        default=None,
        help="grow up to this many workers while all run (default: --workers)",
    )
    g.add_argument(
        "--grow-after",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="with --max-workers: add a worker once all have run this long (default 10)",
    )
    g.add_argument(
        "--auto-workers",
        **_SWITCH,
        help="size the job itself between --workers and --max-workers from its examples/s, "
        "measured over --grow-after seconds at each count: add a worker while each added one "
        "raises examples/s by at least --auto-workers-gain of one worker's share, give back "
        "one that does not (and stay there), or that stays pending for 3 windows",
    )
    g.add_argument(
        "--auto-workers-gain",
        type=float,
        default=0.5,
        metavar="FRACTION",
        help="with --auto-workers: what an added worker must add to examples/s, as a fraction "
        "of the examples/s per worker before it (default 0.5)",
    )
    g.add_argument(
        "--local-slots",
        type=_int,
        metavar="N",
        default=None,
        help=f"with --backend local: at most N {members} run at once; the rest wait, pending, "
        "as pods wait for room on a cluster (default: no limit)",
    )
    g.add_argument(
        "--standby",
        type=_int,
        metavar="N",
        default=0,
        help="extra worker processes kept started, TensorFlow and the model loaded, that "
        "train nothing: one takes a dead worker's slot at once, and a new one starts behind "
        "it. Each holds a worker's resources while idle (default 0)",
    )
    g.add_argument(
        "--backend",
        default="local",
        choices=backend_names(),
        help=f"where {members} run (default local)",
    )
    g.add_argument(
        "--records-per-task",
        type=_int,
        metavar="N",
        default=0,
        help="records in a task, the unit of work handed to a worker (default 0: 512, or for "
        "training with --local-steps K > 1 given 16 batches or K, whichever is more; fewer, "
        "whole batches, where an epoch would have under 32 tasks; the model ends an epoch on "
        "its last task's records)",
    )
    g.add_argument(
        "--max-restarts",
        type=_int,
        metavar="N",
        default=3,
        help="relaunches per slot of a process that crashed or was OOM-killed (default 3); "
        "deleted, preempted and evicted ones are always relaunched",
    )
    g.add_argument(
        "--max-task-retries",
        type=_int,
        metavar="N",
        default=3,
        help="retries of a task that fails in user code, or whose worker dies on it, before "
        "the job fails (default 3)",
    )
    g.add_argument(
        "--task-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="a worker that finishes no batch of its task for this long loses the task, "
        "even while its heartbeats go on (default 120)",
    )
    g.add_argument(
        "--master-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help=f"how long {members} wait for an absent master, and how long the job may "
        f"run with no worker{' or a PS missing' if ps else ''} before it fails (default 300)",
    )
    g.add_argument(
        "--port", type=_int, metavar="N", default=0, help="master port (default: any free)"
    )
    g.add_argument(
        "--job-name",
        metavar="NAME",
        default=None,
        help="names the job's pods, Services and state on a cluster; the same name resumes "
        "the same job (a DNS-1123 label; default: derived from --output)",
    )
    g.add_argument(
        "--state-dir",
        metavar="DIR",
        default=None,
        help=f"a local directory for the master's state and the logs of {members}; "
        "needed where --output is an object store (s3://, gs://, minio://), since the state "
        "needs flock, fsync and atomic rename. Running again with the same one resumes "
        "(default: --output itself when it is local, else "
        "$XDG_STATE_HOME/elastic-step/JOB_NAME, ~/.local/state/... when unset; not with "
        "--backend kubernetes, which keeps the state on the cluster)",
    )
    g.add_argument(
        "--metrics-port",
        type=_unless_empty(_int),
        metavar="N",
        default=None,
        help="serve Prometheus metrics at http://HOST:N/metrics, where HOST is where the "
        "master listens (0: any free port, named in status.json; default: no endpoint)",
    )
    from elastic_step.master.config import TLS_CHOICES

    g.add_argument(
        "--tls",
        choices=TLS_CHOICES,
        default="auto",
        help=f"mutual TLS between the master and its {members}, "
        "under a certificate authority the master makes for the job: only the job's own "
        "instances connect, and no one on the network reads the traffic (default auto: on "
        "with --backend kubernetes, off for local processes)",
    )
    add_kubernetes_flags(p, ps=ps)


def _job_settings(args: argparse.Namespace) -> dict:
    """The EngineConfig fields that :func:`_add_job_flags` sets (training and prediction)."""
    return {
        "workers": args.workers,
        "min_workers": args.min_workers,
        "max_workers": args.max_workers,
        "grow_after_s": args.grow_after,
        "auto_workers": args.auto_workers,
        "auto_workers_gain": args.auto_workers_gain,
        "standby": args.standby,
        "backend": args.backend,
        "records_per_task": args.records_per_task,
        "max_restarts": args.max_restarts,
        "max_task_retries": args.max_task_retries,
        "task_timeout_s": args.task_timeout,
        "master_timeout_s": args.master_timeout,
        "port": args.port,
        "job_name": args.job_name,
        "state_dir": args.state_dir,
        "metrics_port": args.metrics_port,
        "tls": args.tls,
    }


def _add_evaluate(commands) -> None:
    p = commands.add_parser(
        "evaluate",
        help="compute the loss and metrics of a trained model on one split",
        description="Computes the loss and the model definition's metrics, a confusion "
        "matrix for classifiers and a ROC curve for binary ones, on one split of what "
        "`preprocess` wrote.",
    )
    p.add_argument("--model", required=True, metavar="DIR", help="what `train` wrote")
    p.add_argument("--data", required=True, metavar="DIR", help="what `preprocess` wrote")
    p.add_argument("--split", default="validation", help="(default validation)")
    p.add_argument("--metrics-output", required=True, metavar="FILE.json")
    p.add_argument("--batch-size", type=_int, metavar="N", default=256, help="(default 256)")
    p.add_argument(
        "--report",
        metavar="FILE.html",
        help="also write a self-contained HTML report (no network needed to view it): the "
        "evaluation's scalars, confusion matrix and ROC curve, and, from --model's "
        "summary.json when it has one, the training's loss and metrics by model version "
        "and its live workers and restarts over time",
    )


def _add_summary_output(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--summary-output",
        metavar="FILE.json",
        help="also copy the finished job's summary.json here (a pipeline step's output)",
    )


def _copy_summary(status: int, args: argparse.Namespace) -> int:
    """``--summary-output``: the finished job's summary.json, copied where the step wants it."""
    if status == 0 and args.summary_output:
        from elastic_step.data import storage
        from elastic_step.output_layout import OutputLayout

        summary = storage.read_text(OutputLayout(args.output).summary)
        storage.write_text_atomic(args.summary_output, summary)
    return status


def _add_predict(commands) -> None:
    p = commands.add_parser(
        "predict",
        help="run a trained model on a CSV file, Parquet files or a data split, as an elastic job",
        description="Runs the master in this process with prediction tasks: workers load "
        "the model and write each task's predictions once; the master replaces workers "
        "that die and merges the tasks' parts into --output/predictions.csv, one row per "
        "input row in input order, starting with its index. A CSV file or Parquet input is "
        "encoded with the model's schema first (into --output/input/). Running the same "
        "command again resumes an interrupted job without redoing finished tasks.",
    )
    p.add_argument("--model", required=True, metavar="DIR", help="what `train` wrote")
    p.add_argument(
        "--input",
        required=True,
        metavar="INPUT",
        help="a CSV file or Parquet input (as preprocess takes them) with the model's feature "
        "columns (the label column may be there), or what `preprocess` wrote",
    )
    p.add_argument("--output", required=True, metavar="DIR", help="predictions and state")
    p.add_argument(
        "--split", default="validation", help="with a data directory: (default validation)"
    )
    _add_summary_output(p)
    p.add_argument("--batch-size", type=_int, metavar="N", default=256, help="(default 256)")
    _add_job_flags(p, ps=False)


#: The commands that pipeline components run, by name: each adds its parser.
_COMPONENT_COMMANDS = {
    "preprocess": _add_preprocess,
    "train": _add_train,
    "evaluate": _add_evaluate,
    "predict": _add_predict,
}


def command_parser(command: str) -> argparse.ArgumentParser:
    """The parser of ``elastic-step COMMAND`` alone (preprocess, train, evaluate or
    predict): the source of the pipeline components' parameters (components/parameters.py)."""
    commands = argparse.ArgumentParser(prog="elastic-step").add_subparsers()
    _COMPONENT_COMMANDS[command](commands)
    return commands.choices[command]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="elastic-step",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--version",
        action="version",
        version=f"elastic-step {__version__}",
        help="print the version and exit",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _COMPONENT_COMMANDS.values():
        add(commands)
    status = commands.add_parser("status", help="print the status of a job (train or predict)")
    status.add_argument("output", metavar="DIR", help="the job's --output")
    status.add_argument("--json", action="store_true", help="print status.json as it is")
    demo = commands.add_parser(
        "demo", help="preprocess, train (2 workers, 1 PS) and evaluate on scikit-learn's digits"
    )
    demo.add_argument("--workdir", default="demo-output", help="(default ./demo-output)")
    demo.add_argument("--epochs", type=_int, default=8, help="(default 8)")
    return parser


def _backend_options(args: argparse.Namespace) -> object:
    """The chosen backend's typed options; a Kubernetes flag with another backend is an error."""
    if args.backend == "kubernetes":
        if args.local_slots is not None:
            raise InputError("--local-slots applies to --backend local only")
        return options_from_args(args)
    given = kubernetes_flags_given(args)
    if given:
        raise InputError(f"{given[0]} applies to --backend kubernetes only")
    try:
        return LocalOptions(slots=args.local_slots)
    except ValueError as e:
        raise InputError(str(e)) from None


def _preprocess(args: argparse.Namespace) -> None:
    from elastic_step.data.vocabulary import VocabularyOptions

    arguments = {
        "input_path": args.input,
        "label": args.label,
        "output": args.output,
        "shards": args.shards,
        "validation_fraction": args.validation_fraction,
        "seed": args.seed,
        "categorical": [c.strip() for c in args.categorical.split(",") if c.strip()],
        "label_kind": args.label_type,
        "fill_missing": args.fill_missing,
        "one_hot": args.one_hot,
        "vocabulary_options": VocabularyOptions.from_flags(
            max_vocabulary=args.max_vocabulary,
            min_frequency=args.min_frequency,
            oov_buckets=args.oov_buckets,
            hash_buckets=args.hash_buckets,
        ),
        "progress": log.info,
    }
    if args.runner == "beam":
        from elastic_step.data.beam_preprocess import preprocess_on_beam

        preprocess_on_beam(**arguments, beam_options=args.beam_option)
        return
    if args.beam_option:
        raise InputError("--beam-option applies to --runner beam only")
    from elastic_step.data.preprocess import preprocess

    preprocess(**arguments)


def _run(args: argparse.Namespace) -> int:
    if args.command == "preprocess":
        _preprocess(args)
        return 0
    if args.command == "train":
        from elastic_step.master.config import TrainConfig
        from elastic_step.training import train

        config = TrainConfig(
            model_def=args.model_def,
            data=args.data,
            output=args.output,
            epochs=args.epochs,
            batch_size=args.batch_size,
            ps=args.ps,
            seed=args.seed,
            evaluation_steps=args.evaluation_steps,
            checkpoint_steps=args.checkpoint_steps,
            keep_checkpoints=args.keep_checkpoints,
            staleness_modulation=args.staleness_modulation,
            local_steps=args.local_steps,
            outer_optimizer=args.outer_optimizer,
            early_stopping=args.early_stopping,
            keep_best=args.keep_best,
            mlflow_tracking_uri=args.mlflow_tracking_uri,
            mlflow_experiment=args.mlflow_experiment,
            **_job_settings(args),
        )
        backend_options = _backend_options(args)
        if args.dry_run:
            from elastic_step.training import dry_run

            if args.backend != "kubernetes":
                raise InputError("--dry-run needs --backend kubernetes")
            return dry_run(config, backend_options)
        return _copy_summary(train(config, backend_options), args)
    if args.command == "evaluate":
        from elastic_step.evaluate import evaluate
        from elastic_step.report import load_summary, write_report

        # Read first: a malformed summary.json fails before the evaluation runs.
        summary = load_summary(args.model) if args.report else None
        result = evaluate(
            model_dir=args.model,
            data_dir=args.data,
            split=args.split,
            metrics_output=args.metrics_output,
            batch_size=args.batch_size,
        )
        if args.report:
            write_report(evaluation=result, summary=summary, path=args.report)
            log.info("wrote the report: %s", args.report)
        shown = {k: v for k, v in result.items() if k not in ("confusion_matrix", "roc")}
        print(json.dumps(shown, indent=2))
        return 0
    if args.command == "predict":
        from elastic_step.master.config import PredictConfig
        from elastic_step.predict import predict

        config = PredictConfig(
            model_dir=args.model,
            input=args.input,
            split=args.split,
            output=args.output,
            batch_size=args.batch_size,
            **_job_settings(args),
        )
        return _copy_summary(predict(config, _backend_options(args)), args)
    if args.command == "status":
        from elastic_step.master.reporting.reports import print_status

        return print_status(args.output, as_json=args.json)
    if args.command == "demo":
        from elastic_step.demo import run_demo

        return run_demo(args.workdir, epochs=args.epochs)
    raise AssertionError(args.command)


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:
            # Here, not in the interpreter's flush at exit, so that a reader that has gone
            # (`elastic-step status run/ | head -3`) meets the handler below.
            if sys.stdout is not None:  # None when started with stdout closed
                sys.stdout.flush()
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # a pipe of our own, not stdout: a bug to show whole
        _quiet_stdout()
        return BROKEN_PIPE_EXIT


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader has gone (poll reports an error or a
    hang-up on it), so that a BrokenPipeError is that reader's doing."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
    except (AttributeError, OSError, ValueError):  # no file descriptor, or no poll
        return False
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _quiet_stdout() -> None:
    """Points stdout at /dev/null: the interpreter flushes it again at exit, and what is
    still buffered would raise BrokenPipeError there (Python's "Note on SIGPIPE")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The master launches workers and PS through this same entry point.
    if argv and argv[0] in ("worker", "ps"):
        import_tensorflow_quietly()
        if argv[0] == "worker":
            from elastic_step.worker.worker import main as worker_main

            return worker_main(argv[1:])
        from elastic_step.ps.server import main as ps_main

        return ps_main(argv[1:])
    args = build_parser().parse_args(argv)
    # preprocess needs no TensorFlow: without it, its memory is the data's alone.
    master = args.command in ("train", "predict")
    if master:
        configure_master_memory()
    if args.command not in ("status", "preprocess"):
        import_tensorflow_quietly(quietly=not args.verbose, master=master)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        return _run(args)
    except ElasticStepError as e:
        log.debug("the error's traceback:", exc_info=e)
        print(f"elastic-step: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("elastic-step: interrupted", file=sys.stderr)
        return 130
