"""One parameter surface: the components' parameters are their commands' flags.

The flags of ``elastic-step preprocess``, ``train``, ``evaluate`` and ``predict`` are the one
source. Each component takes every flag of its command as a parameter of the same name
(snake_case in KFP, kebab-case in Argo) with the same default, except the flags in
:data:`DEVIATIONS`, each with why. tests/unit/test_component_parameters.py holds the
components to this, argo_templates.py takes each template's defaults from here, and
steps.py turns a KFP component's parameters back into the flags (:func:`arguments`).

Neither engine has a value for "not given": a parameter that is empty (``""``, KFP's
``None``, an empty list, ``false``) is the flag left out. The CLI reads an empty value of an
optional flag as not given, and ``--switch true|false`` as a switch, for Argo, whose template
passes every parameter. A number has no empty value: an :class:`Unset` entry names the one that
stands for "not given" (max_workers 0, KFP's metrics_port -1).
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from elastic_step.components import IMAGE
from elastic_step.errors import InputError

Engine = Literal["kfp", "argo"]
KFP: Engine = "kfp"
ARGO: Engine = "argo"
ENGINES: tuple[Engine, ...] = (KFP, ARGO)

#: The command that each component runs, by the component's name (Argo's; KFP's has
#: underscores).
COMMANDS = {
    "preprocess": "preprocess",
    "elastic-train": "train",
    "evaluate": "evaluate",
    "batch-predict": "predict",
}


@dataclass(frozen=True, kw_only=True)
class Flag:
    """One flag of a command, as argparse defines it."""

    option: str  # --fill-missing
    dest: str  # fill_missing
    default: object
    required: bool
    #: "switch": given alone when true; "list": repeated per value; "value": --flag VALUE.
    kind: Literal["value", "switch", "list"]
    choices: tuple[object, ...] | None


@functools.cache
def command_flags(command: str) -> dict[str, Flag]:
    """The flags of ``elastic-step COMMAND``, by their argparse destination."""
    from elastic_step.cli import command_parser

    flags: dict[str, Flag] = {}
    # argparse lists a parser's arguments only in its private _actions.
    for action in command_parser(command)._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._AppendAction):
            kind = "list"
        elif action.nargs == 0 or action.const is True:  # store_true, or --switch [true|false]
            kind = "switch"
        else:
            kind = "value"
        flags[action.dest] = Flag(
            option=max(action.option_strings, key=len),
            dest=action.dest,
            default=action.default,
            required=action.required,
            kind=kind,
            choices=tuple(action.choices) if action.choices else None,
        )
    return flags


# -- the deviations --


@dataclass(frozen=True)
class LeftOut:
    """The flag is not a parameter of the component."""

    why: str
    engines: tuple[Engine, ...] = ENGINES


@dataclass(frozen=True)
class OwnDefault:
    """The flag is a parameter, with another default."""

    default: object
    why: str
    engines: tuple[Engine, ...] = ENGINES


@dataclass(frozen=True)
class Unset:
    """The parameter's default, ``value``, is the flag left out (the command's own default,
    None): the engine has no empty value of the parameter's type."""

    value: object
    why: str
    engines: tuple[Engine, ...] = ENGINES


@dataclass(frozen=True)
class Renamed:
    """The flag is a parameter under another name (snake_case; Argo's is kebab-case)."""

    name: str
    why: str
    engines: tuple[Engine, ...] = ENGINES


Deviation = LeftOut | OwnDefault | Unset | Renamed

_IN_POD_TEMPLATE = (
    "Argo: set it in the pod-template artifact, a pod merged into every pod of the job (an "
    "Argo template cannot repeat a flag, nor leave one out)"
)
_ARGO_RESOURCES = (
    "Argo: the template has always asked for this much, and passes every parameter (the "
    "CLI reads no empty quantity)"
)

#: What the job-running commands (train, predict) share.
_JOB: dict[str, Deviation | tuple[Deviation, ...]] = {
    "--backend": (
        OwnDefault(
            "kubernetes",
            "KFP: a pipeline step starts its workers as pods; 'local' runs them beside the "
            "master, as under kfp.local",
            (KFP,),
        ),
        LeftOut("Argo: the step always starts its workers as pods", (ARGO,)),
    ),
    "--max-workers": Unset(
        0, "0 is --workers, no growth: an Argo parameter has no empty number, and KFP's agrees"
    ),
    "--metrics-port": Unset(
        -1, "KFP: -1 is no endpoint; kfp.local casts an integer parameter's None with int()", (KFP,)
    ),
    "--port": LeftOut("the master's port in its own pod or process: any free one serves"),
    "--local-slots": LeftOut(
        "a limit on processes beside the master, for trying --auto-workers on one machine: a "
        "step's room is what its cluster grants"
    ),
    "--job-name": LeftOut(
        "Argo: named from the workflow's uid and the node (identity.ARGO_JOB_NAME), so that "
        "a retry resumes its job",
        (ARGO,),
    ),
    "--state-dir": LeftOut(
        "a step's state is on the cluster (kubernetes) or in its output (local): it has no "
        "local directory that outlives it"
    ),
    "--namespace": LeftOut("the job's pods run in the step's own namespace"),
    "--tls": LeftOut(
        "a step's pods always talk mutual TLS (auto, with pods): the pipeline's pods share "
        "a network with other tenants"
    ),
    "--kubeconfig": LeftOut("a step reaches its own cluster, from inside it"),
    "--image": OwnDefault(IMAGE, "Argo: also the image of the step itself", (ARGO,)),
    "--worker-cpu": OwnDefault("1", _ARGO_RESOURCES, (ARGO,)),
    "--worker-memory": OwnDefault("2Gi", _ARGO_RESOURCES, (ARGO,)),
    "--volume": (
        Renamed("volumes", "KFP: a list, under the name it has always had", (KFP,)),
        LeftOut(_IN_POD_TEMPLATE, (ARGO,)),
    ),
    "--pod-template": LeftOut(
        "Argo: the input artifact pod-template (KFP's pod_template is the pod itself, a dict)",
        (ARGO,),
    ),
    **{
        option: LeftOut(_IN_POD_TEMPLATE, (ARGO,))
        for option in (
            "--image-pull-policy",
            "--image-pull-secret",
            "--service-account",
            "--node-selector",
            "--toleration",
            "--worker-priority-class",
            "--high-priority-class",
            "--high-priority-fraction",
            "--env",
            "--storage-secret",
        )
    },
}

#: The flags that are not a component parameter of the same name and default, by command.
DEVIATIONS: dict[str, dict[str, Deviation | tuple[Deviation, ...]]] = {
    "preprocess": {
        "--input": LeftOut("the CSV arrives as the input artifact csv"),
        "--output": LeftOut("KFP: the output artifact data", (KFP,)),
        "--beam-option": (
            Renamed("beam_options", "KFP: a list, named for what it holds", (KFP,)),
            LeftOut(
                "Argo: a template cannot repeat a flag; runner beam runs on Beam's local "
                "runner in the step's pod",
                (ARGO,),
            ),
        ),
    },
    "train": {
        **_JOB,
        "--model-def": LeftOut(
            "the model definition arrives as the input artifact model_def (KFP: or as "
            "model_def_text)"
        ),
        "--data": LeftOut("KFP: the input artifact dataset", (KFP,)),
        "--output": LeftOut("KFP: the output artifact model", (KFP,)),
        "--dry-run": LeftOut(
            "it prints what the master would create and exits; a step runs its job"
        ),
        "--ps-cpu": OwnDefault("1", _ARGO_RESOURCES, (ARGO,)),
        "--ps-memory": OwnDefault("2Gi", _ARGO_RESOURCES, (ARGO,)),
        "--summary-output": LeftOut(
            "KFP: the output artifact summary; Argo: the output parameter and artifact summary"
        ),
    },
    "evaluate": {
        "--model": LeftOut("KFP: the input artifact model", (KFP,)),
        "--data": LeftOut("KFP: the input artifact dataset", (KFP,)),
        "--metrics-output": LeftOut(
            "the output artifact metrics (Argo: and the output parameter metrics)"
        ),
        "--report": LeftOut("the output artifact report"),
    },
    "predict": {
        **_JOB,
        "--model": LeftOut("KFP: the input artifact model", (KFP,)),
        "--input": LeftOut("KFP: the input artifact data, a CSV file or a dataset", (KFP,)),
        "--output": LeftOut("KFP: the output artifact predictions", (KFP,)),
        "--summary-output": LeftOut(
            "KFP: the output artifact summary; Argo: the output parameter summary"
        ),
    },
}


def deviation(command: str, option: str, engine: Engine) -> Deviation | None:
    """How ``option`` of ``command`` deviates in ``engine``'s component, if it does."""
    listed = DEVIATIONS[command].get(option, ())
    for entry in listed if isinstance(listed, tuple) else (listed,):
        if engine in entry.engines:
            return entry
    return None


def parameter_name(command: str, flag: Flag, engine: Engine) -> str | None:
    """The name of ``flag``'s parameter in ``engine``'s component, or None if it has none."""
    entry = deviation(command, flag.option, engine)
    if isinstance(entry, LeftOut):
        return None
    name = entry.name if isinstance(entry, Renamed) else flag.dest
    return name.replace("_", "-") if engine == ARGO else name


def default_of(command: str, flag: Flag, engine: Engine) -> object:
    """The default that ``flag``'s parameter has in ``engine``'s component."""
    entry = deviation(command, flag.option, engine)
    if isinstance(entry, OwnDefault):
        return entry.default
    return entry.value if isinstance(entry, Unset) else flag.default


def argo_value(value: object) -> str:
    """``value`` as an Argo parameter's text, which the CLI reads back as ``value``."""
    if value is None:
        return ""  # the flag left out
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def flag_for(command: str, parameter: str) -> Flag:
    """The flag of a KFP component's parameter (raises KeyError for one that is no flag)."""
    for flag in command_flags(command).values():
        if parameter_name(command, flag, KFP) == parameter:
            return flag
    raise KeyError(f"{parameter} is no flag of elastic-step {command}")


def is_unset(value: object) -> bool:
    """Whether a parameter's value means the flag left out (see the module)."""
    return value is None or value == "" or value is False or value == []


def arguments(command: str, parameters: Mapping[str, object]) -> list[str]:
    """The flags of ``elastic-step COMMAND`` for KFP parameters (names as in the component):
    ``--flag VALUE``, a switch alone when true, a list's flag once per value; an unset
    parameter is left out."""
    argv: list[str] = []
    for name, value in parameters.items():
        flag = flag_for(command, name)
        unset = deviation(command, flag.option, KFP)
        if is_unset(value) or (isinstance(unset, Unset) and value == unset.value):
            continue
        # Here, not in argparse: its error would be a usage message, not one line.
        if flag.choices and value not in flag.choices:
            choices = ", ".join(str(choice) for choice in flag.choices)
            raise InputError(f"{name} must be one of {choices}, got '{value}'")
        if flag.kind == "switch":
            argv.append(flag.option)
        elif flag.kind == "list":
            for item in value:  # type: ignore[attr-defined]
                argv += _flag_value(flag.option, str(item))
        else:
            argv += _flag_value(flag.option, str(value))
    return argv


def _flag_value(option: str, value: str) -> list[str]:
    """``--flag VALUE``, or ``--flag=VALUE`` for a value that argparse would otherwise take
    for a flag (``--beam-option=--runner=DataflowRunner``)."""
    return [f"{option}={value}"] if value.startswith("-") else [option, value]
