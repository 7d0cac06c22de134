"""One parameter surface (components/parameters.py): every flag of preprocess, train,
evaluate and predict is a parameter of its KFP component and of its Argo template, under the
same name and with the same default, or is listed there as a deviation, with why. A flag and
a parameter that drift apart fail here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from kfp import dsl

from elastic_step.cli import command_parser
from elastic_step.components import kfp_components
from elastic_step.components.argo_templates import workflow_template
from elastic_step.components.parameters import (
    ARGO,
    COMMANDS,
    DEVIATIONS,
    KFP,
    Flag,
    Unset,
    argo_value,
    arguments,
    command_flags,
    default_of,
    deviation,
    is_unset,
    parameter_name,
)
from elastic_step.components.steps import predict_command, train_command
from elastic_step.errors import InputError

REPO = Path(__file__).resolve().parents[2]
#: Parameters that are no flag of the command, and why.
NOT_FLAGS = {
    (KFP, "elastic-train"): {
        "model_def_text": "the model definition's source, instead of the model_def artifact",
        "task_name": "names the job with the run's id (identity.py)",
    },
    (KFP, "batch-predict"): {"task_name": "names the job with the run's id (identity.py)"},
    (ARGO, "preprocess"): {"image": "the step's image"},
    (ARGO, "evaluate"): {"image": "the step's image"},
}
#: The kfp type of a flag's parameter, by the Python type of the flag's default.
KFP_TYPES = {bool: "Boolean", int: "Integer", float: "Float", str: "String"}
#: Values for the flags that every command requires (the test reads defaults, not these).
PLACEHOLDER = "x"
#: A parameter named in a template's argument, plainly or in an expression.
REFERENCE = re.compile(r"inputs\.parameters(?:\.([-\w]+)|\['([-\w]+)'\])")


def kfp_parameters(component: str) -> dict:
    """The KFP component's input parameters (not its artifacts), by name."""
    function = getattr(kfp_components, component.replace("-", "_"))
    return {
        name: spec
        for name, spec in function.component_spec.inputs.items()
        if "@" not in spec.type  # an artifact's type is schema_title@version
    }


def argo_template(component: str) -> dict:
    document = yaml.safe_load(workflow_template().to_yaml())
    (template,) = [t for t in document["spec"]["templates"] if t["name"] == component]
    return template


def argo_argv(template: dict, values: dict[str, str] | None = None) -> list[str]:
    """The template's arguments after the command's name, with each parameter's value from
    ``values``, else its default, else a placeholder; an expression (max-workers) gives 2."""
    defaults = {p["name"]: p.get("default", PLACEHOLDER) for p in template["inputs"]["parameters"]}
    defaults.update(values or {})
    argv = []
    for arg in template["container"]["args"][1:]:
        plain = re.fullmatch(r"\{\{inputs\.parameters\.([-\w]+)\}\}", arg)
        argv.append(defaults[plain.group(1)] if plain else "2" if arg.startswith("{{=") else arg)
    return argv


def parse(command: str, argv: list[str]) -> dict:
    """What the command's parser makes of ``argv`` (plus placeholders for required flags)."""
    flags = command_flags(command).values()
    given = set(argv)
    required = [
        item
        for flag in flags
        if flag.required and flag.option not in given
        for item in (flag.option, PLACEHOLDER)
    ]
    return vars(command_parser(command).parse_args(required + argv))


def expected_parameters(command: str, engine: str) -> dict[str, Flag]:
    """The flags that are parameters of ``engine``'s component, by parameter name."""
    flags = command_flags(command).values()
    named = ((parameter_name(command, flag, engine), flag) for flag in flags)
    return {name: flag for name, flag in named if name is not None}


COMPONENTS = pytest.mark.parametrize(("component", "command"), COMMANDS.items())


@COMPONENTS
def test_each_kfp_parameter_is_a_flag_with_its_default(component: str, command: str) -> None:
    parameters = kfp_parameters(component)
    expected = expected_parameters(command, KFP)
    extra = NOT_FLAGS.get((KFP, component), {})
    assert sorted(set(parameters) - set(extra)) == sorted(expected), (
        "each flag is a parameter, or a deviation in components/parameters.py"
    )
    for name, flag in expected.items():
        spec = parameters[name]
        assert spec.optional != flag.required, name
        if flag.required:
            continue
        default = default_of(command, flag, KFP)
        # "" and None are the same: the flag left out.
        assert spec.default == default or (is_unset(spec.default) and is_unset(default)), name
        if flag.kind == "list":
            assert spec.type.startswith("typing.List"), name
        elif default is not None:
            assert spec.type == KFP_TYPES[type(default)], name


@COMPONENTS
def test_kfp_defaults_become_the_commands_defaults(component: str, command: str) -> None:
    """What the step makes of every default (steps.py: parameters.arguments) is what the
    command takes when the flag is not given."""
    parameters = kfp_parameters(component)
    defaults = {
        name: parameters[name].default
        for name, flag in expected_parameters(command, KFP).items()
        if not flag.required
    }
    parsed = parse(command, arguments(command, defaults))
    for name, flag in expected_parameters(command, KFP).items():
        if flag.required:
            continue
        unset = isinstance(deviation(command, flag.option, KFP), Unset)
        expected = flag.default if unset else default_of(command, flag, KFP)
        assert parsed[flag.dest] == expected, name


@COMPONENTS
def test_each_argo_parameter_is_a_flag_with_its_default(component: str, command: str) -> None:
    template = argo_template(component)
    parameters = {p["name"]: p for p in template["inputs"]["parameters"]}
    expected = expected_parameters(command, ARGO)
    extra = NOT_FLAGS.get((ARGO, component), {})
    assert sorted(set(parameters) - set(extra)) == sorted(expected), (
        "each flag is a parameter, or a deviation in components/parameters.py"
    )
    args = template["container"]["args"]
    parsed = parse(command, argo_argv(template))
    for name, flag in expected.items():
        assert ("default" not in parameters[name]) == flag.required, name
        # The template passes the parameter to its flag...
        value = args[args.index(flag.option) + 1]
        assert name in {a or b for a, b in REFERENCE.findall(value)}, name
        if flag.required or value.startswith("{{="):  # an expression: max-workers
            continue
        # ...whose default is the command's, as text and as the command reads it.
        default = default_of(command, flag, ARGO)
        assert parameters[name]["default"] == argo_value(default), name
        assert parsed[flag.dest] == default, name


@pytest.mark.parametrize("command", COMMANDS.values())
def test_every_deviation_names_a_flag_of_its_command(command: str) -> None:
    options = {flag.option for flag in command_flags(command).values()}
    assert set(DEVIATIONS[command]) <= options, "a stale entry in components/parameters.py"


@pytest.fixture
def shards_default_moved(monkeypatch):
    """The command's --shards default moved from 4 to 5, and the components not."""
    import elastic_step.cli

    def parser(command: str):
        parser = command_parser(command)
        parser.set_defaults(**({"shards": 5} if command == "preprocess" else {}))
        return parser

    monkeypatch.setattr(elastic_step.cli, "command_parser", parser)
    command_flags.cache_clear()
    yield
    command_flags.cache_clear()


def test_a_default_that_drifts_fails_the_check(shards_default_moved) -> None:
    assert command_flags("preprocess")["shards"].default == 5
    with pytest.raises(AssertionError, match="shards"):
        test_each_kfp_parameter_is_a_flag_with_its_default("preprocess", "preprocess")
    # Argo's defaults are the command's, made by argo_templates.py: they follow (and the
    # committed YAML goes stale, which test_components_yaml.py catches).
    test_each_argo_parameter_is_a_flag_with_its_default("preprocess", "preprocess")
    shards = [
        p for p in argo_template("preprocess")["inputs"]["parameters"] if p["name"] == "shards"
    ]
    assert shards[0]["default"] == "5"


# -- what issue 18 asked for --


def test_preprocess_and_training_take_what_a_pipeline_user_needs() -> None:
    preprocess = kfp_parameters("preprocess")
    assert preprocess["fill_missing"].default == "" and preprocess["one_hot"].default is False
    train = kfp_parameters("elastic-train")
    for name in (
        "early_stopping",
        "keep_best",
        "local_steps",
        "outer_optimizer",
        "evaluation_steps",
        "checkpoint_steps",
        "max_restarts",
        "max_task_retries",
        "task_timeout",
        "master_timeout",
        "grow_after",
        "metrics_port",
        "worker_gpu",
        "node_selector",
        "toleration",
        "pod_template",
    ):
        assert name in train, name


def test_the_argo_templates_take_the_same_parameters() -> None:
    """fill-missing, one-hot and early-stopping, set in Argo, reach the command."""
    settings = {"fill-missing": "mean", "one-hot": "true", "early-stopping": "loss:3"}
    parsed = parse("preprocess", argo_argv(argo_template("preprocess"), settings))
    assert (parsed["fill_missing"], parsed["one_hot"]) == ("mean", True)
    parsed = parse("train", argo_argv(argo_template("elastic-train"), settings))
    assert parsed["early_stopping"] == "loss:3"


def test_the_kfp_settings_reach_the_command(tmp_path) -> None:
    """fill_missing, one_hot, early_stopping and the placement settings, as a step passes
    them."""
    argv = ["--input", "a.csv", "--output", "out/", "--label", "y"]
    argv += arguments("preprocess", {"fill_missing": "mean", "one_hot": True})
    parsed = parse("preprocess", argv)
    assert (parsed["fill_missing"], parsed["one_hot"]) == ("mean", True)
    command = train_command(
        dataset=dsl.Dataset(name="data", uri="minio://b/data"),
        model=dsl.Model(name="model", uri="minio://b/model"),
        model_def_text="def model(): ...\n",
        backend="kubernetes",
        task_name="elastic-train",
        early_stopping="accuracy:2:max",
        keep_best="loss",
        local_steps=4,
        outer_optimizer="nesterov",
        metrics_port=9090,
        worker_gpu=1,
        node_selector=["gpu=a100"],
        toleration=["nvidia.com/gpu:NoSchedule"],
        pod_template={"spec": {"priorityClassName": "high"}},
        max_workers=0,
    )
    parsed = parse("train", command.argv[1:])
    assert parsed["early_stopping"] == "accuracy:2:max" and parsed["keep_best"] == "loss"
    assert (parsed["local_steps"], parsed["outer_optimizer"]) == (4, "nesterov")
    assert (parsed["metrics_port"], parsed["worker_gpu"], parsed["max_workers"]) == (9090, 1, None)
    assert parsed["node_selector"] == ["gpu=a100"]
    assert parsed["toleration"] == ["nvidia.com/gpu:NoSchedule"]
    with open(parsed["pod_template"]) as f:
        assert yaml.safe_load(f) == {"spec": {"priorityClassName": "high"}}


def test_local_workers_get_no_pod_settings(tmp_path) -> None:
    """The command refuses pod settings with local workers: the step leaves them out."""
    data = tmp_path / "data"
    data.mkdir()
    command = predict_command(
        model=dsl.Model(name="model", uri=str(tmp_path / "model")),
        data=dsl.Dataset(name="data", uri=str(data)),
        predictions=dsl.Dataset(name="predictions", uri=str(tmp_path / "predictions")),
        summary=dsl.Artifact(name="summary", uri=str(tmp_path / "summary.json")),
        backend="local",
        task_name="batch-predict",
        worker_gpu=1,
        toleration=["gpu:NoSchedule"],
        pod_template={"spec": {}},
        metrics_port=0,
    )
    parsed = parse("predict", command.argv[1:])
    assert parsed["worker_gpu"] == 0 and parsed["toleration"] == []
    assert parsed["pod_template"] is None and parsed["metrics_port"] == 0


def test_a_setting_out_of_the_commands_choices_is_one_line() -> None:
    with pytest.raises(InputError, match=r"^label_type must be one of auto, class, numeric"):
        arguments("preprocess", {"label_type": "bogus"})


EXAMPLE_IMAGE = "pipelinechannel--image"


def test_the_example_pipeline_hands_each_setting_on_under_its_name() -> None:
    """A pipeline parameter given to a component is the component's parameter by name."""
    spec, _ = yaml.safe_load_all((REPO / "pipelines/kfp_pipeline.yaml").read_text())
    handed = {}
    for task in spec["root"]["dag"]["tasks"].values():
        for name, value in task.get("inputs", {}).get("parameters", {}).items():
            # An importer's uri, and the image that set_container_image hands on, are not a
            # component's parameters.
            if "componentInputParameter" in value and name not in ("uri", EXAMPLE_IMAGE):
                handed[name] = value["componentInputParameter"]
    assert handed and all(name == source for name, source in handed.items()), handed
    assert {"fill_missing", "one_hot", "early_stopping"} <= set(handed)


def test_a_deviation_applies_to_its_engine_only() -> None:
    flags = command_flags("train")
    assert deviation("train", "--data", KFP) is not None
    assert deviation("train", "--data", ARGO) is None
    assert parameter_name("train", flags["volume"], KFP) == "volumes"
    assert parameter_name("train", flags["volume"], ARGO) is None
    assert parameter_name("train", flags["early_stopping"], ARGO) == "early-stopping"
