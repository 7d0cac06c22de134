"""The committed component and pipeline YAML: generated from the Python, valid for the
engines that read it (kfp's pipeline_spec protos and loader, Argo's JSON schema)."""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from jsonschema import Draft202012Validator
from kfp import components
from kfp.pipeline_spec import pipeline_spec_pb2

from elastic_step.components import IMAGE, kfp_components
from pipelines.render import rendered, stale

REPO = Path(__file__).resolve().parents[2]
ARGO_SCHEMA = REPO / "tests" / "schemas" / "argo" / "schema.json.gz"
KFP_COMPONENTS = {
    "preprocess": "components/kfp/preprocess.yaml",
    "elastic_train": "components/kfp/elastic_train.yaml",
    "evaluate": "components/kfp/evaluate.yaml",
    "batch_predict": "components/kfp/batch_predict.yaml",
}
KFP_FILES = [*KFP_COMPONENTS.values(), "pipelines/kfp_pipeline.yaml"]
ARGO_FILES = ["components/argo/workflow-template.yaml", "pipelines/argo_workflow.yaml"]


@pytest.fixture(scope="module")
def files() -> dict[str, str]:
    return rendered()


def test_the_committed_yaml_is_what_the_python_generates(files: dict[str, str]) -> None:
    assert sorted(files) == sorted(KFP_FILES + ARGO_FILES)
    assert stale(REPO, files) == [], "run `make components` and commit the YAML"


EXAMPLE = "pipelines/kfp_pipeline.yaml"
#: The example pipeline sets every step's image once, from its parameter ``image``.
EXAMPLE_IMAGE = "{{$.inputs.parameters['pipelinechannel--image']}}"


@pytest.mark.parametrize("name", KFP_FILES)
def test_kfp_yaml_is_a_pipeline_spec(name: str) -> None:
    spec, *platform = yaml.safe_load_all((REPO / name).read_text())
    # ParseDict rejects any field the proto does not have.
    pipeline = json_format.ParseDict(spec, pipeline_spec_pb2.PipelineSpec())
    assert pipeline.sdk_version == "kfp-2.17.0"
    for executor in pipeline.deployment_spec["executors"].values():
        if "container" in executor:
            container = executor["container"]
            assert container["image"] == (EXAMPLE_IMAGE if name == EXAMPLE else IMAGE)
            command = " ".join([*container["command"], *container["args"]])
            assert "kfp.dsl.executor_main" in command
            assert "pip install" not in command  # nothing installed at run time
    for document in platform:
        json_format.ParseDict(document, pipeline_spec_pb2.PlatformSpec())
    if name == EXAMPLE:
        image = pipeline.root.input_definitions.parameters["image"]
        assert image.default_value.string_value == IMAGE


@pytest.mark.parametrize(("function", "name"), KFP_COMPONENTS.items())
def test_kfp_components_load_back_from_yaml(function: str, name: str) -> None:
    python = getattr(kfp_components, function).component_spec
    loaded = components.load_component_from_file(str(REPO / name)).component_spec
    assert loaded.name == python.name == function.replace("_", "-")
    assert loaded.inputs.keys() == python.inputs.keys()
    assert loaded.outputs.keys() == python.outputs.keys()
    assert loaded.implementation.container.image == IMAGE


@pytest.mark.parametrize("task", ["elastic-train", "batch-predict"])
def test_the_example_pipeline_names_each_job_by_its_task(task: str) -> None:
    spec, platform = yaml.safe_load_all((REPO / "pipelines/kfp_pipeline.yaml").read_text())
    step = spec["root"]["dag"]["tasks"][task]
    task_name = step["inputs"]["parameters"]["task_name"]
    # Resolved by KFP only as a task's whole input, which is why it is passed this way.
    assert task_name == {"runtimeValue": {"constant": "{{$.pipeline_task_name}}"}}
    # KFP retries every failure, bad input's exit status 2 too (docs/guides/pipelines.md,
    # "Retries").
    assert "retryPolicy" not in step
    # The master reads and writes the object store itself: it gets the credentials.
    executor = step["componentRef"]["name"].replace("comp-", "exec-")
    kubernetes = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"][executor]
    (secret,) = kubernetes["secretAsEnv"]
    assert {e["envVar"] for e in secret["keyToEnv"]} == {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    }


@functools.cache
def argo_schema() -> dict:
    with gzip.open(ARGO_SCHEMA, "rt") as f:
        return json.load(f)


def _validator(schema: dict, kind: str | None) -> Draft202012Validator:
    """The whole schema (a oneOf over kinds), or one kind's definition: its errors say where."""
    if kind is None:
        return Draft202012Validator(schema)
    return Draft202012Validator(
        {
            "$schema": schema["$schema"],
            "definitions": schema["definitions"],
            "$ref": f"#/definitions/io.argoproj.workflow.v1alpha1.{kind}",
        }
    )


@pytest.mark.parametrize("name", ARGO_FILES)
def test_argo_yaml_follows_argos_schema(name: str) -> None:
    schema = argo_schema()
    document = yaml.safe_load((REPO / name).read_text())
    for validator in (_validator(schema, document["kind"]), _validator(schema, None)):
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(document)]
        assert errors == []


def test_argo_schema_check_catches_a_wrong_type() -> None:
    schema = argo_schema()
    document = yaml.safe_load((REPO / ARGO_FILES[0]).read_text())
    document["spec"]["templates"][1]["retryStrategy"]["limit"] = 2  # IntOrString: a string
    errors = list(_validator(schema, "WorkflowTemplate").iter_errors(document))
    assert [list(e.absolute_path) for e in errors] == [
        ["spec", "templates", 1, "retryStrategy", "limit"]
    ]
