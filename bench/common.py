"""What the benchmarks share: this checkout's elastic_step first on the path, progress lines,
the machine's readings (load, CPU), the preprocessed data a bench reuses, and the header and
file of a run's JSON result.

Imported before anything of elastic_step: importing it puts this checkout ahead of an
installed copy.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if sys.path[0] != REPO:
    sys.path.insert(0, REPO)  # this checkout's elastic_step, not an installed one

CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def code_version() -> str:
    """The checkout's commit, with "-dirty" when files differ from it (the figures depend on
    the engine's code as it is, committed or not)."""
    try:
        result = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return result.stdout.strip()


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as "1.00, 0.80, 0.50"."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def load_1min() -> float:
    """The 1 minute load average, to 2 decimals."""
    return round(os.getloadavg()[0], 2)


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / CLK_TCK


def proc_stat_fields(path: str) -> list[str]:
    """The fields of a /proc stat file after the command name (which may hold spaces): [1] the
    parent, [3] the session, [11] and [12] user and system CPU in clock ticks."""
    with open(path) as f:
        return f.read().rsplit(")", 1)[1].split()


def children_cpu_s() -> float:
    """CPU seconds of every finished descendant that was waited for (the master waits for its
    workers and PS, and this process for the master)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mb(pid: int) -> int | None:
    """The peak resident memory of process ``pid`` (its VmHWM), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (for now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def elastic_step_command() -> list[str]:
    """The argv that runs this checkout's ``elastic-step``."""
    return [sys.executable, "-m", "elastic_step"]


def start(args: argparse.Namespace) -> None:
    """A bench's first step: ``args.workdir`` made absolute and created, and TensorFlow's C++
    info lines off in this process and the ones it starts (they inherit the environment)."""
    args.workdir = os.path.abspath(args.workdir)
    os.makedirs(args.workdir, exist_ok=True)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def preprocess_once(
    data_dir: str, stamp: dict, write_csv: Callable[[], str], flags: list[str]
) -> None:
    """``data_dir``: the CSV that ``write_csv()`` writes (it returns its path), preprocessed by
    the real CLI with ``flags`` (the label, the split...). Skipped when the data there was made
    with the same ``stamp`` (the settings the data depends on), kept next to it in
    ``data.json``."""
    stamp_path = os.path.join(os.path.dirname(data_dir), "data.json")
    if os.path.exists(stamp_path) and os.path.isdir(data_dir):
        with open(stamp_path) as f:
            if json.load(f) == stamp:
                log(f"reusing the preprocessed data in {data_dir}")
                return
    csv_path = write_csv()
    shutil.rmtree(data_dir, ignore_errors=True)
    command = [*elastic_step_command(), "preprocess", "--input", csv_path, "--output", data_dir]
    command += flags
    log("preprocessing: " + " ".join(command))
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=REPO)
    log(f"preprocessed in {time.perf_counter() - started:.1f}s")
    with open(stamp_path, "w") as f:
        json.dump(stamp, f)


def distinct_ints(text: str, *, minimum: int, what: str) -> list[int]:
    """An option's comma-separated integers, each >= ``minimum``, none twice (an argparse
    ``type``)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from None
    if not values or min(values) < minimum or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(
            f"want distinct {what} >= {minimum}, comma-separated, got {text!r}"
        )
    return values


def accounting_exact(epochs: list[dict]) -> bool:
    """Whether every epoch of a job's accounting trained exactly the records it expected."""
    return all(e["records_trained"] == e["records_expected"] for e in epochs)


def run_header(**machine: object) -> dict:
    """What a result file starts with: when, on what machine (``machine`` adds to it), which
    code, and the command."""
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            **machine,
        },
        "code": code_version(),
        "command": " ".join([os.path.relpath(sys.executable, REPO), *sys.argv]),
    }


def write_result(path: str, document: dict) -> None:
    """``document`` as indented JSON at ``path``."""
    with open(path, "w") as f:
        json.dump(document, f, indent=2)
        f.write("\n")


class BenchError(Exception):
    """A step of the bench did not happen, or not in time; the message says which."""


def wait_until(
    what: str,
    check: Callable[[], Any],
    timeout: float,
    interval: float = 0.05,
    failure: Callable[[], str | None] = lambda: None,
    pause: Callable[[float], object] = time.sleep,
):
    """check()'s first truthy value, polled every ``interval`` (``pause`` waits between polls:
    a condition's ``wait`` polls again as soon as it is notified); BenchError naming ``what``
    after ``timeout``, or with ``failure()``'s reason as soon as it gives one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        reason = failure()
        if reason is not None:
            raise BenchError(reason)
        pause(interval)
    raise BenchError(f"no {what} within {timeout:.0f} s")
