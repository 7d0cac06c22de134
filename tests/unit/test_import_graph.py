"""The floors of elastic_step/ (docs/design.md): the imports between its packages form no
cycle, the master reaches TensorFlow only through model/, and worker/ and ps/ are siblings.

Every import statement counts, the lazy ones inside functions and those under
``TYPE_CHECKING`` too: a cycle that only closes at run time is still a cycle.
"""

from __future__ import annotations

import ast
import itertools
import sys
from collections import defaultdict
from pathlib import Path

import elastic_step

PACKAGE = Path(elastic_step.__file__).parent
TENSORFLOW = ("tensorflow", "keras", "tf_keras", "tensorboard")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[str, int]]:
    """Every module ``path`` imports (``from a import b`` gives ``a`` and ``a.b``), with the
    line of the statement."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.append((base, node.lineno))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return found


def floor_of(module: str) -> str:
    """The package-level node: ``elastic_step.master`` for anything under master/, and a
    top-level module (``elastic_step.cli``) for itself."""
    return ".".join(module.split(".")[:2])


def package_graph() -> dict[str, dict[str, str]]:
    """node -> {node it imports: one import site, for the message}."""
    graph: dict[str, dict[str, str]] = defaultdict(dict)
    for path in sorted(PACKAGE.rglob("*.py")):
        source = floor_of(module_name(path))
        for target, line in imports_of(path):
            if not target.startswith("elastic_step."):
                continue
            node = floor_of(target)
            if node != source and node != "elastic_step.__version__":
                where = f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
                graph[source].setdefault(node, where)
    return graph


def find_cycle(graph: dict[str, dict[str, str]]) -> list[str] | None:
    """One cycle as its import sites, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            cycle = [*path[path.index(node) :], node]
            return [graph[a][b] for a, b in itertools.pairwise(cycle)]
        if node in done:
            return None
        for target in sorted(graph.get(node, {})):
            found = visit(target, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for node in sorted(graph):
        found = visit(node, [])
        if found:
            return found
    return None


def test_the_packages_of_elastic_step_import_each_other_in_no_cycle() -> None:
    cycle = find_cycle(package_graph())
    assert cycle is None, "an import cycle:\n" + "\n".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b": "a imports b"}, "b": {"c": "b imports c"}, "c": {"a": "c imports a"}}
    assert find_cycle(graph) == ["a imports b", "b imports c", "c imports a"]
    assert find_cycle({"a": {"b": "a imports b"}, "b": {}}) is None


def test_the_master_imports_tensorflow_only_through_the_model_layer() -> None:
    direct = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
        for path in sorted((PACKAGE / "master").rglob("*.py"))
        for target, line in imports_of(path)
        if target.split(".")[0] in TENSORFLOW
    ]
    assert direct == []


def test_worker_and_ps_are_siblings_that_share_only_rpc_and_model() -> None:
    graph = package_graph()
    for process in ("elastic_step.worker", "elastic_step.ps"):
        # The ground floor's single modules (see the model layer's test below) are for all.
        leaves = {"elastic_step.errors", "elastic_step.user_errors", "elastic_step.output_layout"}
        below = set(graph[process]) - leaves
        assert below <= {"elastic_step.rpc", "elastic_step.model", "elastic_step.data"}, graph[
            process
        ]


def test_the_model_layer_stands_on_the_ground_floor_only() -> None:
    ground = {
        "elastic_step.data",
        "elastic_step.rpc",
        "elastic_step.errors",
        "elastic_step.user_errors",
        "elastic_step.output_layout",
    }
    assert set(package_graph()["elastic_step.model"]) <= ground


def test_backends_take_typed_options_and_leave_argparse_to_the_cli() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted((PACKAGE / "backends").rglob("*.py"))
        for target, line in imports_of(path)
        if target == "argparse"
    ]
    assert found == []


def test_the_master_stands_above_the_processes_without_importing_them() -> None:
    below = set(package_graph()["elastic_step.master"])
    assert not below & {"elastic_step.worker", "elastic_step.ps"}, below


def module_graph(package: Path) -> dict[str, dict[str, str]]:
    """The modules of ``package`` -> {module of it they import: one import site}."""
    paths = sorted(package.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    graph: dict[str, dict[str, str]] = defaultdict(dict)
    for path in paths:
        source = module_name(path)
        for target, line in imports_of(path):
            parts = target.split(".")
            known = next(
                (".".join(parts[:n]) for n in range(len(parts), 0, -1)
                 if ".".join(parts[:n]) in modules),
                None,
            )  # fmt: skip
            if known is not None and known != source:
                where = f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
                graph[source].setdefault(known, where)
    return graph


def test_the_modules_of_data_import_each_other_in_no_cycle() -> None:
    # storage.py chooses object_storage.py by scheme; both implement storage_api.py's Storage.
    graph = module_graph(PACKAGE / "data")
    assert "elastic_step.data.storage" not in graph["elastic_step.data.object_storage"]
    cycle = find_cycle(graph)
    assert cycle is None, "an import cycle:\n" + "\n".join(cycle or [])


MASTER = PACKAGE / "master"
MAX_ROOT_MODULES = 12


def master_rooms() -> dict[str, set[str]]:
    """Each room of master/ -> the rooms its docstring's "May import:" line names."""
    rooms = {}
    for init in sorted(MASTER.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        line = next((x for x in doc.splitlines() if x.startswith("May import:")), None)
        assert line is not None, f"{init.relative_to(PACKAGE.parent)}: no 'May import:' line"
        named = line.removeprefix("May import:").strip().rstrip(".")
        rooms[init.parent.name] = (
            set() if named == "no other room" else {r.strip() for r in named.split(",")}
        )
    return rooms


def room_imports() -> list[tuple[str, str, str]]:
    """(room, what it imports in master/ outside itself, the import site), for every import
    of a room's module, lazy ones included."""
    found = []
    for path in sorted(MASTER.glob("*/**/*.py")):
        room = path.relative_to(MASTER).parts[0]
        for target, line in imports_of(path):
            parts = target.split(".")
            if parts[:2] != ["elastic_step", "master"] or len(parts) < 3 or parts[2] == room:
                continue
            found.append((room, parts[2], f"{path.relative_to(PACKAGE.parent)}:{line}"))
    return list(dict.fromkeys(found))


def test_the_master_keeps_its_root_small() -> None:
    root = sorted(p.name for p in MASTER.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_each_room_of_the_master_imports_only_the_rooms_its_docstring_names() -> None:
    rooms = master_rooms()
    assert {"tasks", "instances", "job_state", "reporting", "saving"} <= set(rooms)
    for named in rooms.values():
        assert named <= set(rooms), named
    wrong = [
        f"{site} imports elastic_step.master.{target}: "
        + ("the root, above every room" if target not in rooms else f"not named by {room}")
        for room, target, site in room_imports()
        if target not in rooms.get(room, set())
    ]
    assert wrong == []


def test_the_rooms_of_the_master_import_each_other_in_no_cycle() -> None:
    named = {room: {t: f"{room} may import {t}" for t in ts} for room, ts in master_rooms().items()}
    cycle = find_cycle(named)
    assert cycle is None, "rooms that name each other:\n" + "\n".join(cycle or [])


def test_a_room_importing_the_root_or_an_unnamed_room_is_found(tmp_path, monkeypatch) -> None:
    room = tmp_path / "elastic_step" / "master" / "tasks"
    room.mkdir(parents=True)
    (room / "__init__.py").write_text('"""Tasks.\n\nMay import: no other room.\n"""\n')
    (room / "leak.py").write_text(
        "def f():\n    from elastic_step.master.job import Job\n"
        "    from elastic_step.master.instances.api import Instance\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "elastic_step")
    monkeypatch.setattr(sys.modules[__name__], "MASTER", tmp_path / "elastic_step" / "master")
    assert [(r, t) for r, t, _ in room_imports()] == [("tasks", "job"), ("tasks", "instances")]
    assert master_rooms() == {"tasks": set()}
