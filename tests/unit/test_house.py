"""The house's habits, checked on the source alone: every module's tests can be found (a test
file named after it, or its docstring says where), no class passes 500 lines, and
``master/job.py`` stays under 300 lines.

Static checks with ``ast``: nothing of elastic_step is imported, the generated gRPC stubs
(``*_pb2*.py``) are left out.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import elastic_step

PACKAGE = Path(elastic_step.__file__).parent
ROOT = PACKAGE.parent
TESTS = ROOT / "tests"
MAX_CLASS_LINES = 500
MAX_JOB_LINES = 300


def sources() -> list[Path]:
    """Every hand-written module of elastic_step/, packages' ``__init__.py`` included."""
    return [p for p in sorted(PACKAGE.rglob("*.py")) if "_pb2" not in p.name]


def modules() -> list[Path]:
    """The modules that should have tests: all but ``__init__.py`` and ``__main__.py``."""
    return [p for p in sources() if p.name not in ("__init__.py", "__main__.py")]


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""


def test_every_module_s_tests_can_be_found() -> None:
    """A test file is named after the module (``test_<module>.py`` or
    ``test_<package>_<module>.py``, anywhere under tests/), or its docstring says where its
    tests are."""
    test_files = {p.stem for p in TESTS.rglob("test_*.py")}
    lost = [
        str(path.relative_to(ROOT))
        for path in modules()
        if not {f"test_{path.stem}", f"test_{path.parent.name}_{path.stem}"} & test_files
        and "tests/" not in docstring(path)
    ]
    assert not lost, (
        f"{len(lost)} modules whose tests cannot be found: name a test file after the module, "
        "or end its docstring with 'Tests: tests/...':\n  " + "\n  ".join(lost)
    )


def test_the_test_files_a_docstring_names_exist() -> None:
    """A docstring's ``tests/....py`` (a glob such as ``test_model_*.py`` too) is a real file."""
    missing = []
    for path in sources():
        for named in sorted(set(re.findall(r"\btests/[\w/*.-]*?\.py\b", docstring(path)))):
            if not any(ROOT.glob(named)):
                missing.append(f"{path.relative_to(ROOT)}: {named}")
    assert not missing, "docstrings name test files that do not exist:\n  " + "\n  ".join(missing)


def test_no_class_passes_500_lines() -> None:
    big = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    big.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines")
    assert not big, f"classes over {MAX_CLASS_LINES} lines:\n  " + "\n  ".join(big)


def test_the_job_module_stays_under_300_lines() -> None:
    lines = len((PACKAGE / "master" / "job.py").read_text().splitlines())
    assert lines < MAX_JOB_LINES, f"elastic_step/master/job.py has {lines} lines"
