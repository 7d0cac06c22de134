"""What the image installs: every package locked with hashes, none of the test and development
tools, and an environment built as the Containerfile builds it that runs every process of a
job. (No container runtime here: the environment is built in a virtualenv, with the same
lock and flags.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGE_LOCK = ROOT / "requirements-image.lock"
DEV_LOCK = ROOT / "requirements.lock"
TOOLS = {"pytest", "pytest-timeout", "ruff", "moto", "flask", "flask-cors", "py-spy"}
TOOLS |= {"grpcio-tools", "hera", "kfp-kubernetes"}  # compile-time only
_PIN = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)")


def locked(path: Path) -> dict[str, tuple[str, int]]:
    """Package -> (version, how many hashes) of a lock file."""
    found: dict[str, tuple[str, int]] = {}
    name = None
    for line in path.read_text().splitlines():
        match = _PIN.match(line)
        if match:
            name = match[1].lower()
            found[name] = (match[2], 0)
        elif name and line.strip().startswith("--hash=sha256:"):
            version, hashes = found[name]
            found[name] = (version, hashes + 1)
    return found


def test_both_locks_pin_every_package_with_hashes_and_agree_on_versions() -> None:
    image, dev = locked(IMAGE_LOCK), locked(DEV_LOCK)
    assert len(image) > 50 and len(dev) > len(image)
    assert [n for n, (_, hashes) in {**image, **dev}.items() if hashes == 0] == []
    assert {n: v for n, (v, _) in image.items() if dev.get(n, ("",))[0] != v} == {}


def test_the_image_lock_holds_no_test_or_development_tool() -> None:
    assert set(locked(IMAGE_LOCK)) & TOOLS == set()
    assert set(locked(DEV_LOCK)) >= {"pytest", "ruff", "moto"}  # they are only here


def test_the_containerfile_installs_the_image_lock_with_hashes_and_nothing_unpinned() -> None:
    containerfile = (ROOT / "Containerfile").read_text()
    runs = [line for line in containerfile.splitlines() if line.startswith("RUN pip install")]
    assert runs == [
        "RUN pip install --no-deps --require-hashes -r requirements-image.lock",
        "RUN pip install --no-deps --no-build-isolation . && python -m compileall -q "
        "/usr/local/lib/python3.11/site-packages",
    ]
    instructions = [line for line in containerfile.splitlines() if not line.startswith("#")]
    assert not [line for line in instructions if "requirements.lock" in line]


def test_the_image_environment_runs_every_process_and_has_no_tools(tmp_path: Path) -> None:
    uv = Path(sys.executable).parent / "uv"
    source = tmp_path / "source"  # the build writes build/ and egg-info beside the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "elastic_step", source / "elastic_step", ignore=shutil.ignore_patterns("__pycache__")
    )
    venv = tmp_path / "image"
    python = str(venv / "bin" / "python")

    def run(*argv: str | Path) -> str:
        done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{' '.join(map(str, argv))}:\n{done.stdout}{done.stderr}"
        return done.stdout

    run(uv, "venv", "-q", "--python", sys.executable, venv)
    run(uv, "pip", "install", "-q", "--python", python, "--no-deps", "--require-hashes",
        "-r", IMAGE_LOCK)  # fmt: skip
    run(uv, "pip", "install", "-q", "--python", python, "--no-deps", "--no-build-isolation", source)
    run(uv, "pip", "check", "--python", python)  # the lock is complete: nothing missing
    listed = json.loads(run(uv, "pip", "list", "--python", python, "--format", "json"))
    installed = {p["name"].lower() for p in listed}
    assert "elastic-step" in installed and "tensorflow" in installed
    assert installed & TOOLS == set()
    modules = ["elastic_step.cli", "elastic_step.master.job", "elastic_step.worker.worker",
               "elastic_step.ps.server", "elastic_step.components.steps",
               "elastic_step.backends.kubernetes", "elastic_step.data.object_storage",
               "elastic_step.master.reporting.metrics_endpoint", "elastic_step.demo"]  # fmt: skip
    run(python, "-c", "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]",
        *modules)  # fmt: skip
    assert "usage: elastic-step" in run(venv / "bin" / "elastic-step", "--help")
