"""MkDocs hooks: the reference pages, generated from the code each time the site is built.

A page holds a marker, ``<!-- generated: NAME -->``, where the text made by ``NAME``'s
function goes:

- ``cli``: every command of ``elastic-step`` and each of its flags, from the CLI's parser
  (``elastic_step.cli.build_parser``), with the help that ``--help`` prints;
- ``components``: each pipeline component's parameters, inputs and outputs, from the
  compiled components in ``components/`` (which tests/unit/test_components_yaml.py keeps
  equal to the code), and the flags that are not parameters, with why
  (``elastic_step.components.parameters``);
- ``metrics``: the master's Prometheus metrics, from their declarations
  (``elastic_step.master.reporting.metrics_endpoint.METRICS``);
- ``reports``: the fields of a job's ``status.json`` and ``summary.json``
  (``elastic_step.master.reporting.report_fields``), which the end-to-end tests hold a job to;
- ``version``: the version of elastic-step that the site documents.

So the reference cannot drift from the code: a flag added to the parser is on the site at
the next build. Tests: tests/e2e/test_docs_site.py.
"""

from __future__ import annotations

import argparse
import html
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import yaml

import elastic_step
from elastic_step import __version__
from elastic_step.cli import build_parser
from elastic_step.components import parameters
from elastic_step.master.reporting import report_fields
from elastic_step.master.reporting.metrics_endpoint import METRICS

#: The checkout the site documents (also when a test builds the site from a copy of docs/).
ROOT = Path(elastic_step.__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- generated: ([a-z]+) -->")


def on_config(config, **_):
    config.copyright = f"elastic-step {__version__}"
    return config


def on_page_markdown(markdown: str, page, config, files, **_) -> str:
    def generated(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(
                f"{page.file.src_path}: no generator {name!r} (has {list(GENERATORS)})"
            )
        return GENERATORS[name]()

    return MARKER.sub(generated, markdown)


def text(value: object) -> str:
    """``value`` as literal text in Markdown, table cells included: no character of it is
    taken for Markdown or HTML."""
    escaped = html.escape(" ".join(str(value).split()))
    for char in "|*_[]`\\":
        escaped = escaped.replace(char, f"&#{ord(char)};")
    return escaped


def table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def version() -> str:
    return f"This site documents elastic-step {__version__}."


# -- the command line --


def _subcommands(parser: argparse.ArgumentParser) -> tuple[dict, dict[str, str]]:
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help or "" for choice in commands._choices_actions}
    return commands.choices, helps


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    default = action.default
    unset = default is None or default is False or default is argparse.SUPPRESS
    if action.nargs == 0 or unset or default in ("", []):
        return ""
    return f"`{default}`" if "`" not in str(default) else text(default)


#: The columns of a table of flags.
FLAG_COLUMNS = ["Flag", "Default", "What it does"]


def _usage(parser: argparse.ArgumentParser) -> str:
    return "```text\n" + parser.format_usage().strip() + "\n```\n"


def _flag_rows(formatter: argparse.HelpFormatter, actions: Iterable[argparse.Action]):
    for action in actions:
        if action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            metavar = (
                ""
                if action.nargs == 0
                else f" {formatter._format_args(action, action.dest.upper())}"
            )
            names = ", ".join(f"`{option}{metavar}`" for option in action.option_strings)
        else:
            names = f"`{formatter._metavar_formatter(action, action.dest)(1)[0]}`"
        what = formatter._expand_help(action) if action.help else ""
        if action.choices and not isinstance(action, argparse._SubParsersAction):
            what += f" (one of: {', '.join(map(str, action.choices))})"
        yield [names, _default(action), text(what)]


def _command_section(name: str, help_: str, parser: argparse.ArgumentParser) -> str:
    formatter = parser._get_formatter()
    parts = [f"## elastic-step {name}\n", text(help_) + "\n" if help_ else ""]
    if parser.description:
        parts.append(text(parser.description) + "\n")
    parts.append(_usage(parser))
    for group in parser._action_groups:
        rows = list(_flag_rows(formatter, group._group_actions))
        if rows:
            parts.append(f"### {text(group.title.capitalize())}\n")
            if group.description:
                parts.append(text(group.description) + "\n")
            parts.append(table(FLAG_COLUMNS, rows))
    return "\n".join(part for part in parts if part)


def cli() -> str:
    parser = build_parser()
    commands, helps = _subcommands(parser)
    top = list(
        _flag_rows(parser._get_formatter(), (a for a in parser._actions if a.option_strings))
    )
    sections = [
        _usage(parser),
        table(FLAG_COLUMNS, top),
        table(
            ["Command", "What it does"],
            ([f"[`{n}`](#elastic-step-{n})", text(helps.get(n, ""))] for n in commands),
        ),
    ]
    sections += [_command_section(name, helps.get(name, ""), p) for name, p in commands.items()]
    return "\n".join(sections)


# -- the pipeline components --


#: KFP's parameter types, as its UI names them.
KFP_TYPES = {
    "STRING": "string",
    "NUMBER_INTEGER": "integer",
    "NUMBER_DOUBLE": "number",
    "BOOLEAN": "boolean",
    "LIST": "list",
    "STRUCT": "dict",
}


def _kfp_default(spec: dict) -> str:
    if "defaultValue" not in spec:
        return "" if spec.get("isOptional") else "required"
    value = spec["defaultValue"]
    if spec.get("parameterType") == "NUMBER_INTEGER":
        value = int(value)
    return f"`{json.dumps(value)}`"


def _kfp(name: str) -> str:
    module = name.replace("-", "_")
    spec = yaml.safe_load((ROOT / "components" / "kfp" / f"{module}.yaml").read_text())
    inputs, outputs = spec["root"]["inputDefinitions"], spec["root"].get("outputDefinitions", {})
    parts = [
        "### On Kubeflow Pipelines\n",
        f"`components/kfp/{module}.yaml`; in Python, "
        f"`elastic_step.components.kfp_components.{module}`.\n",
    ]
    if inputs.get("parameters"):
        parts.append("#### Parameters\n")
        parts.append(
            table(
                ["Parameter", "Type", "Default", "What it is"],
                (
                    [
                        f"`{p}`",
                        KFP_TYPES[s["parameterType"]],
                        _kfp_default(s),
                        text(s.get("description", "")),
                    ]
                    for p, s in inputs["parameters"].items()
                ),
            )
        )

    def rows(section: dict, outputs: bool) -> list[list[str]]:
        found = [
            [f"`{a}`", text(s["artifactType"]["schemaTitle"]), text(s.get("description", ""))]
            for a, s in section.get("artifacts", {}).items()
        ]
        if outputs:  # an input parameter is in the table above
            found += [
                [f"`{p}`", KFP_TYPES[s["parameterType"]], text(s.get("description", ""))]
                for p, s in section.get("parameters", {}).items()
            ]
        return found

    return "\n".join(parts + _inputs_and_outputs(inputs, outputs, rows, "Type"))


def _inputs_and_outputs(
    inputs: dict, outputs: dict, rows: Callable[[dict, bool], list[list[str]]], kind: str
) -> list[str]:
    """The tables of a component's input artifacts and of its outputs."""
    parts = []
    for title, section in (("Input artifacts", inputs), ("Outputs", outputs)):
        if found := rows(section, title == "Outputs"):
            parts += [f"#### {title}\n", table(["Name", kind, "What it is"], found)]
    return parts


def _argo_templates() -> dict[str, dict]:
    spec = yaml.safe_load((ROOT / "components" / "argo" / "workflow-template.yaml").read_text())
    return {t["name"]: t for t in spec["spec"]["templates"]}


def _argo(name: str, template: dict) -> str:
    parts = [
        "### On Argo Workflows\n",
        f"The template `{name}` of the WorkflowTemplate `elastic-step` "
        "(`components/argo/workflow-template.yaml`).\n",
    ]
    inputs, outputs = template.get("inputs", {}), template.get("outputs", {})
    if inputs.get("parameters"):
        parts.append("#### Parameters\n")
        parts.append(
            table(
                ["Parameter", "Default", "What it is"],
                (
                    [
                        f"`{p['name']}`",
                        f"`{p['default']}`" if "default" in p else "required",
                        text(p.get("description", "")),
                    ]
                    for p in inputs["parameters"]
                ),
            )
        )

    def rows(section: dict, outputs: bool) -> list[list[str]]:
        found = [
            [f"`{a['name']}`", "artifact", text(a.get("path", ""))]
            for a in section.get("artifacts", [])
        ]
        if outputs:  # an input parameter is in the table above
            found += [
                [f"`{p['name']}`", "parameter", text(p.get("description", ""))]
                for p in section.get("parameters", [])
            ]
        return found

    return "\n".join(parts + _inputs_and_outputs(inputs, outputs, rows, "Kind"))


def _left_out(command: str) -> str:
    rows = []
    for flag in parameters.command_flags(command).values():
        why: dict[str, list[str]] = {}
        for engine, engine_name in ((parameters.KFP, "KFP"), (parameters.ARGO, "Argo")):
            entry = parameters.deviation(command, flag.option, engine)
            if isinstance(entry, parameters.LeftOut):
                why.setdefault(entry.why, []).append(engine_name)
        rows += [[f"`{flag.option}`", ", ".join(e), text(w)] for w, e in why.items()]
    if not rows:
        return ""
    return "#### Flags that are not parameters\n\n" + table(["Flag", "Engine", "Why"], rows)


def components() -> str:
    templates = _argo_templates()
    sections = []
    for name, command in parameters.COMMANDS.items():
        sections += [
            f"## {name}\n",
            f"Runs [`elastic-step {command}`](cli.md#elastic-step-{command}): each parameter "
            "is the flag of the same name (Argo's in kebab-case), with the flag's default "
            "unless the table says otherwise.\n",
            _kfp(name),
            _argo(name, templates[name]),
            _left_out(command),
        ]
    return "\n".join(s for s in sections if s)


# -- the Prometheus metrics --


def metrics() -> str:
    rows = (
        [
            f"`{spec.exposed}`",
            spec.kind,
            ", ".join(f"`{label}`" for label in spec.labels),
            text(spec.help),
            text(spec.absent or ""),
        ]
        for spec in METRICS.values()
    )
    return table(["Metric", "Type", "Labels", "What it is", "Absent"], rows)


# -- status.json and summary.json --


def reports() -> str:
    parts = []
    for document, fields in (
        ("status.json", report_fields.STATUS),
        ("summary.json", report_fields.SUMMARY),
    ):
        parts.append(f"## {document}\n")
        for kind, described in fields.items():
            parts.append(f"### Of `elastic-step {kind}`\n")
            # Descriptions are written in Markdown: code spans name values and fields.
            parts.append(
                table(["Field", "What it holds"], ([f"`{n}`", d] for n, d in described.items()))
            )
    return "\n".join(parts)


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli,
    "components": components,
    "metrics": metrics,
    "reports": reports,
    "version": version,
}
