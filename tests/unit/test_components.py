"""The pipeline components' own logic: job names, where the job's pods find artifacts, and
the commands that the KFP components and the Argo templates run, read by the real CLI."""

from __future__ import annotations

import re

import pytest
import yaml
from kfp import dsl

from elastic_step.backends.kubernetes_options import RoleResources, Volume
from elastic_step.cli import build_parser
from elastic_step.components import IMAGE, identity
from elastic_step.components.argo_templates import workflow_template
from elastic_step.components.locations import shared_location
from elastic_step.components.parameters import arguments
from elastic_step.components.steps import (
    model_def_file,
    predict_command,
    preprocess_step,
    record_predictions,
    train_command,
)
from elastic_step.errors import InputError
from elastic_step.kubernetes_flags import options_from_args
from elastic_step.master.config import JOB_NAME

# -- job names --


def test_a_job_name_is_a_valid_label_fixed_by_run_and_step() -> None:
    name = identity.job_name_for("8f0c-run", "elastic-train")
    assert JOB_NAME.fullmatch(name)
    assert name == identity.job_name_for("8f0c-run", "elastic-train")  # a retry finds it
    assert name != identity.job_name_for("8f0d-run", "elastic-train")
    assert name != identity.job_name_for("8f0c-run", "elastic-train-2")


def test_an_explicit_job_name_wins() -> None:
    name = identity.kfp_job_name(
        job_name="digits", task_name="", output="/x", env={"KFP_POD_NAME": "p"}
    )
    assert name == "digits"


def test_off_a_kfp_cluster_the_output_names_the_job() -> None:
    """kfp.local: no pod to read; every local run has its own output."""
    one = identity.kfp_job_name(job_name="", task_name="train", output="/root/run-1", env={})
    two = identity.kfp_job_name(job_name="", task_name="train", output="/root/run-2", env={})
    assert one == identity.job_name_for("/root/run-1", "train") and one != two


@pytest.mark.parametrize("task_name", ["", "{{$.pipeline_task_name}}"])
def test_on_a_kfp_cluster_an_unresolved_task_name_is_refused(task_name: str) -> None:
    with pytest.raises(InputError, match=r"need task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER"):
        identity.kfp_job_name(
            job_name="", task_name=task_name, output="s3://b/m", env={"KFP_POD_NAME": "p"}
        )


def test_the_argo_expression_gives_what_job_name_for_gives() -> None:
    assert identity.ARGO_JOB_NAME == (
        "es-{{=sprig.trunc(12, sprig.sha256sum(workflow.uid + '/' + node.name))}}"
    )
    # What Argo v4.0.5's template engine (util/template.Replace) made of ARGO_JOB_NAME with
    # workflow.uid and node.name set to these two values.
    uid, node = "1b0f6c1e-0000-4000-8000-000000000001", "elastic-step-example-abcde.train"
    assert identity.job_name_for(uid, node) == "es-7add59cae49b"


# -- where the job's pods find an artifact --

REMOTE = dsl.Dataset(name="data", uri="minio://mlpipeline/v2/artifacts/p/run/preprocess/x/data")
LOCAL_ONLY = dsl.Dataset(name="data", uri="/tmp/root/p/run/preprocess/data")


def test_worker_pods_use_an_object_store_uri_directly() -> None:
    assert shared_location(REMOTE, backend="kubernetes", volumes=[]) == REMOTE.uri


def test_a_claim_that_holds_the_local_copy_is_used_as_it_is() -> None:
    claim = Volume(claim="artifacts", mount="/minio")
    assert REMOTE.path.startswith("/minio/")
    assert shared_location(REMOTE, backend="kubernetes", volumes=[claim]) == REMOTE.path
    other = Volume(claim="artifacts", mount="/min")  # a prefix of the path, not its parent
    assert shared_location(REMOTE, backend="kubernetes", volumes=[other]) == REMOTE.uri


def test_local_workers_use_the_local_path() -> None:
    assert shared_location(REMOTE, backend="local", volumes=[]) == REMOTE.path
    assert shared_location(LOCAL_ONLY, backend="local", volumes=[]) == LOCAL_ONLY.path


def test_an_artifact_no_pod_can_reach_is_refused() -> None:
    with pytest.raises(InputError, match=r"artifact 'data' is at /tmp/root/.*volumes"):
        shared_location(LOCAL_ONLY, backend="kubernetes", volumes=[])


# -- the commands --


def test_parameters_become_flags_and_unset_ones_are_left_out() -> None:
    parameters = {"seed": 0, "categorical": "", "fill_missing": None, "label": "y"}
    assert arguments("preprocess", parameters) == ["--seed", "0", "--label", "y"]
    assert arguments("preprocess", {"one_hot": True}) == ["--one-hot"]
    assert arguments("preprocess", {"one_hot": False}) == []
    volumes = {"volumes": ["claim=a,mount=/a", "claim=b,mount=/b"], "toleration": []}
    assert arguments("train", volumes) == [
        *["--volume", "claim=a,mount=/a", "--volume", "claim=b,mount=/b"]
    ]


def test_bad_input_ends_a_step_as_it_ends_the_command(tmp_path, capsys) -> None:
    """One line on stderr and exit status 2, whether the step or the command finds it."""
    csv_file = dsl.Dataset(name="csv", uri=str(tmp_path / "data.csv"))
    data = dsl.Dataset(name="data", uri=str(tmp_path / "data"))
    with pytest.raises(SystemExit) as exited:
        preprocess_step(csv=csv_file, data=data, label="y", label_type="bogus")
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "elastic-step: error: label_type must be one of auto, class, numeric, got 'bogus'\n"
    )
    (tmp_path / "data.csv").write_text("x,y\n1,a\n,b\n")
    with pytest.raises(SystemExit) as exited:
        preprocess_step(csv=csv_file, data=data, label="y", fill_missing="bogus")
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("elastic-step: error: --fill-missing must be")


def test_exactly_one_model_definition(tmp_path) -> None:
    artifact = dsl.Artifact(name="model_def", uri=str(tmp_path / "model.py"))
    assert model_def_file(artifact, "") == artifact.path
    with open(model_def_file(None, "def model(): ...\n")) as f:
        assert f.read() == "def model(): ...\n"
    for given, text in ((artifact, "x = 1"), (None, "")):
        with pytest.raises(InputError, match="exactly one model definition"):
            model_def_file(given, text)


TRAIN_SETTINGS = dict(
    model_def_text="def model(): ...\n",
    epochs=3,
    batch_size=32,
    workers=2,
    min_workers=1,
    max_workers=6,
    ps=2,
    records_per_task=128,
    seed=7,
    image="registry.example.com/elastic-step:1",
    worker_cpu="2",
    worker_memory="4Gi",
    ps_cpu="1",
    ps_memory="2Gi",
    worker_priority_class="elastic-step-low",
    storage_secret="mlpipeline-minio-artifact",
    volumes=["claim=shared,mount=/shared,readonly"],
    job_name="",
    task_name="elastic-train",
)


def _train_command(model_uri: str, backend: str, **settings) -> tuple:
    """The train command on REMOTE's data for a model at ``model_uri`` (TRAIN_SETTINGS, with
    ``settings`` over them), and the CLI's parse of its argv."""
    command = train_command(
        dataset=REMOTE,
        model=dsl.Model(name="model", uri=model_uri),
        backend=backend,
        **{**TRAIN_SETTINGS, **settings},
    )
    return command, build_parser().parse_args(command.argv)


def test_the_train_command_on_kubernetes_is_one_the_cli_takes() -> None:
    command, args = _train_command(
        "minio://mlpipeline/v2/artifacts/p/run/train/y/model", "kubernetes"
    )
    assert (args.data, args.output) == (REMOTE.uri, command.output)
    assert command.output.startswith("minio://") and args.job_name == command.job_name
    assert (args.epochs, args.batch_size, args.workers, args.max_workers) == (3, 32, 2, 6)
    assert (args.ps, args.records_per_task, args.seed, args.backend) == (2, 128, 7, "kubernetes")
    options = options_from_args(args)
    assert options.image == "registry.example.com/elastic-step:1"
    assert options.worker == RoleResources(cpu="2", memory="4Gi")
    assert options.ps == RoleResources(cpu="1", memory="2Gi")
    assert options.worker_priority_class == "elastic-step-low"
    assert options.storage_secret == "mlpipeline-minio-artifact"
    assert options.volumes == (Volume(claim="shared", mount="/shared", read_only=True),)


def test_the_train_command_with_local_workers_has_no_kubernetes_flags() -> None:
    _, args = _train_command("/tmp/root/p/run/train/model", "local", max_workers=0)
    assert (args.backend, args.data, args.max_workers) == ("local", REMOTE.path, None)
    assert args.image is None and args.volume == [] and args.storage_secret is None


def test_an_unknown_backend_is_refused() -> None:
    with pytest.raises(InputError, match="backend must be one of kubernetes, local, got 'k8s'"):
        train_command(dataset=REMOTE, model=REMOTE, backend="k8s", **TRAIN_SETTINGS)


JOB_SETTINGS = {
    key: TRAIN_SETTINGS[key]
    for key in (
        "workers",
        "min_workers",
        "max_workers",
        "records_per_task",
        "image",
        "worker_cpu",
        "worker_memory",
        "worker_priority_class",
        "storage_secret",
        "volumes",
        "job_name",
    )
}
MODEL = dsl.Model(name="model", uri="minio://mlpipeline/v2/artifacts/p/run/train/y/model")
CSV = dsl.Dataset(name="csv", uri="minio://mlpipeline/datasets/new.csv")


def _predict_command(data: dsl.Dataset, backend: str, tmp_path) -> tuple:
    predictions = dsl.Dataset(name="predictions", uri="minio://mlpipeline/v2/run/p/predictions")
    summary = dsl.Artifact(name="summary", uri=str(tmp_path / "summary.json"))
    command = predict_command(
        model=MODEL,
        data=data,
        predictions=predictions,
        summary=summary,
        split="test",
        batch_size=128,
        backend=backend,
        task_name="batch-predict",
        **JOB_SETTINGS,
    )
    return command, build_parser().parse_args(command.argv)


def test_the_predict_command_on_kubernetes_is_one_the_cli_takes(tmp_path) -> None:
    command, args = _predict_command(CSV, "kubernetes", tmp_path)
    assert args.command == "predict" and args.backend == "kubernetes"
    assert (args.model, args.input, args.output) == (MODEL.uri, CSV.uri, command.output)
    assert command.output == "minio://mlpipeline/v2/run/p/predictions"
    assert args.summary_output == str(tmp_path / "summary.json")
    assert (args.batch_size, args.workers, args.min_workers, args.max_workers) == (128, 2, 1, 6)
    assert args.records_per_task == 128 and args.job_name == command.job_name
    # Off a KFP cluster, named as the train step's job is: by its output and its task.
    assert command.job_name == identity.job_name_for(command.output, "batch-predict")
    options = options_from_args(args)
    assert options.image == "registry.example.com/elastic-step:1"
    assert options.worker == RoleResources(cpu="2", memory="4Gi")
    assert options.worker_priority_class == "elastic-step-low"
    assert options.storage_secret == "mlpipeline-minio-artifact"
    assert options.volumes == (Volume(claim="shared", mount="/shared", read_only=True),)
    assert "--ps-cpu" not in command.argv and "--ps" not in command.argv  # no PS


def test_predict_reads_a_split_of_a_dataset_and_all_of_a_csv(tmp_path) -> None:
    """The artifact's local copy says which: a directory is what preprocess wrote."""
    (tmp_path / "data").mkdir()
    (tmp_path / "new.csv").write_text("a,b\n1,2\n")
    dataset = dsl.Dataset(name="data", uri=str(tmp_path / "data"))
    command, args = _predict_command(dataset, "local", tmp_path)
    assert (args.input, args.split) == (dataset.path, "test") and "--split" in command.argv
    csv_file = dsl.Dataset(name="data", uri=str(tmp_path / "new.csv"))
    command, args = _predict_command(csv_file, "local", tmp_path)
    assert args.input == csv_file.path and "--split" not in command.argv
    assert args.image is None and args.volume == []  # local workers: no pod settings


def test_the_predictions_metadata_counts_rows_and_classes(tmp_path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "predictions.csv").write_text(
        'index,class,output_0,output_1\n0,cat,0.9,0.1\n1,"a, b",0.2,0.8\n2,cat,0.7,0.3\n'
    )
    (tmp_path / "summary.json").write_text('{"examples_per_second": 812.5}')
    predictions = dsl.Dataset(name="predictions", uri=str(tmp_path / "out"))
    summary = dsl.Artifact(name="summary", uri=str(tmp_path / "summary.json"))
    record_predictions(
        output=predictions.path, predictions=predictions, summary=summary, job_name="es-1"
    )
    assert predictions.metadata == {
        "rows": 3,
        "columns": ["index", "class", "output_0", "output_1"],
        "job_name": "es-1",
        "class_counts": {"a, b": 1, "cat": 2},
        "examples_per_second": 812.5,
    }


# -- the Argo templates --

PARAMETER = re.compile(r"\{\{inputs\.parameters\.([-\w]+)\}\}")
#: A parameter named anywhere, in a simple tag or in an expression.
REFERENCE = re.compile(r"inputs\.parameters(?:\.([-\w]+)|\['([-\w]+)'\])")
#: What Argo's expressions give, for the CLI to parse.
EXPRESSIONS = {identity.ARGO_JOB_NAME: "es-0123456789ab"}


def _templates() -> dict[str, dict]:
    document = yaml.safe_load(workflow_template().to_yaml())
    return {t["name"]: t for t in document["spec"]["templates"]}


@pytest.mark.parametrize(
    ("name", "command"),
    [
        ("preprocess", "preprocess"),
        ("elastic-train", "train"),
        ("evaluate", "evaluate"),
        ("batch-predict", "predict"),
    ],
)
def test_each_argo_template_runs_a_command_the_cli_takes(name: str, command: str) -> None:
    template = _templates()[name]
    declared = {p["name"]: p.get("default", "x") for p in template["inputs"]["parameters"]}
    container = template["container"]
    used = {
        dotted or indexed
        for arg in [container["image"], *container["args"]]
        for dotted, indexed in REFERENCE.findall(arg)
    }
    assert used == set(declared), "every parameter is used, and only declared ones"
    assert container["command"] == ["elastic-step"]
    assert declared["image"] == IMAGE
    argv = []
    for arg in container["args"]:
        arg = EXPRESSIONS.get(arg, arg)
        if arg.startswith("{{="):
            arg = "2"  # --max-workers: max(workers, max-workers)
        argv.append(PARAMETER.sub(lambda m: str(declared[m.group(1)]), arg))
    args = build_parser().parse_args(argv)
    assert args.command == command


def test_the_argo_template_names_are_the_four_components() -> None:
    assert list(_templates()) == ["preprocess", "elastic-train", "evaluate", "batch-predict"]


@pytest.mark.parametrize("name", ["elastic-train", "batch-predict"])
def test_the_argo_job_steps_are_retried_and_resume_their_job(name: str) -> None:
    template = _templates()[name]
    args = template["container"]["args"]
    assert args[args.index("--job-name") + 1] == identity.ARGO_JOB_NAME
    strategy = template["retryStrategy"]
    assert strategy["limit"] == "2" and strategy["retryPolicy"] == "Always"
    assert strategy["expression"] == "lastRetry.exitCode != '2'"  # bad input is not retried
    env = {
        e["name"]: e.get("value") or e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in template["container"]["env"]
    }
    assert env == {
        "ELASTIC_STEP_POD_NAME": "metadata.name",
        "ELASTIC_STEP_POD_IP": "status.podIP",
        "HOME": "/tmp",
    }
    # The master's pod is known as one to the network policy, from its creation.
    assert template["metadata"]["labels"] == {"elastic-step/master": "true"}


@pytest.mark.parametrize("name", ["preprocess", "elastic-train", "evaluate", "batch-predict"])
def test_every_argo_step_runs_restricted_on_a_read_only_image(name: str) -> None:
    template = _templates()[name]
    container = template["container"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    # Writable: /tmp (inputs, outputs, HOME), an emptyDir of the pod's own.
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert template["volumes"] == [{"name": "tmp", "emptyDir": {}}]
    requests = container["resources"]["requests"]
    assert set(requests) == {"cpu", "memory"} and "limits" not in container["resources"]


@pytest.mark.parametrize("name", ["elastic-train", "batch-predict"])
def test_the_argo_job_steps_output_the_jobs_summary(name: str) -> None:
    """elastic-train's summary.json holds what KFP's elastic-train gives as its metrics,
    summary and job_name outputs."""
    template = _templates()[name]
    args = template["container"]["args"]
    path = args[args.index("--summary-output") + 1]
    (summary,) = template["outputs"]["parameters"]
    assert summary["name"] == "summary" and summary["valueFrom"] == {"path": path}
    if name == "elastic-train":
        (artifact,) = template["outputs"]["artifacts"]
        assert artifact == {"name": "summary", "path": path}
