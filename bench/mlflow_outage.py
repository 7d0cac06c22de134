"""What MLflow tracking costs a job, and what a tracking server that goes away costs it.

Every run is ``elastic-step train`` (the real CLI: master, 1 PS and 2 worker processes) on
scikit-learn's digits, preprocessed by the real ``elastic-step preprocess``, with the same
seed and settings, one run at a time, in three ways, ``--repeats`` rounds of the three in
turn (so that a drift of the machine falls on all three alike):

- none: no tracking;
- up: ``--mlflow-tracking-uri`` of a real ``mlflow server`` (SQLite, on loopback) that runs
  throughout;
- away: the same, but the bench stops the server (SIGTERM) once the job's model version
  passes ``--stop-at`` of its expected end; the job then trains on, and ends without it.

It prints each run's wall time (the ``train`` process's, start-up included), the mean of each
way, and the ratio of "up" and "away" to "none" (the issue's target: away <= 1.10), whether
each run exited 0 with exact accounting, and the MLflow warnings of the "away" runs; it
writes ``WORKDIR/mlflow_outage.json``. Nothing is a timed assertion. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

from common import (
    HERE,
    REPO,
    BenchError,
    accounting_exact,
    elastic_step_command,
    free_port,
    load_average,
    log,
    preprocess_once,
    proc_stat_fields,
    run_header,
    start,
    wait_until,
    write_result,
)

TARGET = 1.10
WAYS = ("none", "up", "away")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=20, help="epochs of each run (default 20)")
    p.add_argument("--repeats", type=int, default=3, help="rounds of the three ways (default 3)")
    p.add_argument(
        "--stop-at",
        type=float,
        default=0.4,
        help="stop the server once this fraction of the job's model versions is done (default 0.4)",
    )
    p.add_argument("--workdir", default=os.path.join(HERE, "results", "mlflow"))
    return p.parse_args()


class Server:
    """``mlflow server`` on a loopback port, its store under ``root``."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.uri = f"http://127.0.0.1:{free_port()}"
        mlflow = os.path.join(os.path.dirname(sys.executable), "mlflow")
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, "server.log"), "a") as out:
            self.proc = subprocess.Popen(
                [
                    mlflow, "server", "--host", "127.0.0.1", "--port", self.uri.rsplit(":", 1)[1],
                    "--workers", "1",
                    "--backend-store-uri", f"sqlite:///{os.path.join(root, 'mlflow.db')}",
                    "--artifacts-destination", os.path.join(root, "artifacts"),
                ],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                # Its job runner (7 more processes, for GenAI jobs) is not what a job uses.
                env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
            )  # fmt: skip
        wait_until(
            "answer from mlflow server",
            self._healthy,
            timeout=90,
            interval=0.5,
            failure=lambda: "mlflow server exited" if self.proc.poll() is not None else None,
        )
        # It goes on starting after it answers (its workers, its store): a job started then
        # would pay for the server's start, which a real server has behind it.
        wait_until("mlflow server idle", self._idle, timeout=60, interval=0.0)

    def _cpu_s(self) -> float:
        """CPU seconds of the server's processes (its session: it leads it)."""
        total = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fields = proc_stat_fields(f"/proc/{entry}/stat")
            except OSError:
                continue
            if int(fields[3]) == self.proc.pid:  # its process group
                total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def _idle(self) -> bool:
        """Whether the server used under 2 % of a core over the last second."""
        before = self._cpu_s()
        time.sleep(1.0)
        return self._cpu_s() - before < 0.02

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)


def model_version(output: str) -> int:
    try:
        with open(os.path.join(output, "status.json")) as f:
            return json.load(f).get("model_version", 0)
    except (OSError, ValueError):
        return 0


def one_run(args, data: str, way: str, index: int, expected_versions: int) -> dict:
    output = os.path.join(args.workdir, f"run-{way}-{index}")
    shutil.rmtree(output, ignore_errors=True)
    server = None
    command = [
        *elastic_step_command(), "train", "--model-def",
        os.path.join(REPO, "elastic_step", "examples", "digits.py"),
        "--data", data, "--output", output, "--epochs", str(args.epochs), "--workers", "2",
        "--batch-size", "32", "--records-per-task", "64", "--seed", "7",
    ]  # fmt: skip
    if way != "none":
        server = Server(os.path.join(args.workdir, f"mlflow-{way}-{index}"))
        command += ["--mlflow-tracking-uri", server.uri, "--mlflow-experiment", "bench"]
    log_path = f"{output}.log"
    stopped_at = None
    try:
        started = time.monotonic()
        with open(log_path, "w") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
            if way == "away":
                stop_version = int(expected_versions * args.stop_at)
                wait_until(
                    f"model version {stop_version}",
                    lambda: model_version(output) >= stop_version,
                    timeout=600,
                    interval=0.2,
                    failure=lambda: "train exited early" if proc.poll() is not None else None,
                )
                stopped_at = round(time.monotonic() - started, 1)
                server.stop()
            status = proc.wait(timeout=1200)
        wall = time.monotonic() - started
    finally:
        if server is not None:
            server.stop()
    with open(os.path.join(output, "summary.json")) as f:
        summary = json.load(f)
    with open(log_path) as f:
        warnings = [line.strip() for line in f if "WARNING" in line and "MLflow" in line]
    exact = accounting_exact(summary["epochs"])
    return {
        "way": way,
        "wall_s": round(wall, 2),
        "exit": status,
        "exact": exact,
        "model_version": summary["model_version"],
        "server_stopped_at_s": stopped_at,
        "mlflow_warnings": warnings,
    }


def main() -> int:
    args = parse_args()
    start(args)
    data = os.path.join(args.workdir, "digits", "data")

    def write_csv() -> str:
        from elastic_step.demo import write_digits_csv

        path = os.path.join(args.workdir, "digits", "digits.csv")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_digits_csv(path)
        return path

    preprocess_once(data, {"data": "digits"}, write_csv, ["--label", "digit"])
    log(f"load average before: {load_average()}")
    runs: list[dict] = []
    expected = 0
    try:
        for index in range(args.repeats):
            for way in WAYS:
                log(f"round {index + 1}/{args.repeats}: {way}")
                run = one_run(args, data, way, index, expected or 10**9)
                expected = expected or run["model_version"]
                runs.append(run)
                log(
                    f"  {run['wall_s']:.1f} s, exit {run['exit']}, exact {run['exact']}, "
                    f"{len(run['mlflow_warnings'])} MLflow warnings"
                )
    except BenchError as e:
        print(f"mlflow_outage: {e}", file=sys.stderr)
        return 1
    means = {
        way: sum(r["wall_s"] for r in runs if r["way"] == way)
        / max(1, sum(r["way"] == way for r in runs))
        for way in WAYS
    }
    ratios = {way: round(means[way] / means["none"], 3) for way in ("up", "away")}
    print()
    print(f"{'way':6} {'runs (s)':30} {'mean (s)':>9} {'/ none':>7}")
    for way in WAYS:
        walls = ", ".join(f"{r['wall_s']:.1f}" for r in runs if r["way"] == way)
        ratio = "" if way == "none" else f"{ratios[way]:.3f}"
        print(f"{way:6} {walls:30} {means[way]:9.1f} {ratio:>7}")
    print(f"target: away / none <= {TARGET}: {'met' if ratios['away'] <= TARGET else 'missed'}")
    document = {
        **run_header(load_after=load_average()),
        "epochs": args.epochs,
        "stop_at": args.stop_at,
        "runs": runs,
        "mean_wall_s": {k: round(v, 2) for k, v in means.items()},
        "ratio_to_none": ratios,
        "target": TARGET,
    }
    path = os.path.join(args.workdir, "mlflow_outage.json")
    write_result(path, document)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
