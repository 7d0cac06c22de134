"""Goodput under faults: wall time of a small real job with a worker SIGKILLed every 20 s,
against the same job undisturbed.

Both runs are ``elastic-step train`` (the real CLI in a subprocess: master, 1 PS and 2 worker
processes over gRPC) on scikit-learn's digits, preprocessed by the real ``elastic-step
preprocess``, with the same seed and settings, one after the other in one invocation (never
at the same time). In the faulty run, every ``--kill-every`` seconds from the start of the
``train`` process, the bench reads ``status.json``, picks one running worker at random and
sends its process SIGKILL, as tests/e2e/test_fault_tolerance.py does. A SIGKILLed worker
crashed as far as the master knows: it counts toward ``--max-restarts`` (set high in both runs)
and as a failure of the task it held, and it is replaced.

It prints both wall times, their ratio (target <= 1.15), the kills, whether each run's
accounting was exact (every epoch's records_trained == records_expected in summary.json) and
each run's final accuracy, and writes ``WORKDIR/goodput.json``. Nothing is a timed assertion.
See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

from common import (
    HERE,
    REPO,
    children_cpu_s,
    elastic_step_command,
    load_1min,
    log,
    machine_busy_s,
    preprocess_once,
    run_header,
    start,
    write_result,
)

TARGET = 1.15
STALE_STATUS_S = 2.0
#: What the master logs once every epoch is trained, before it saves the model.
TRAINED_LINE = "epochs trained and evaluated; saving the model"


# -- data --


def prepare_data(workdir: str) -> str:
    """The digits as CSV, preprocessed by the real CLI (once; reused by later runs)."""
    from elastic_step.demo import write_digits_csv

    def write() -> str:
        csv_path = os.path.join(workdir, "digits.csv")
        rows = write_digits_csv(csv_path)
        log(f"wrote the digits ({rows} rows) to {csv_path}")
        return csv_path

    data_dir = os.path.join(workdir, "data")
    preprocess_once(data_dir, {"data": "digits"}, write, ["--label", "digit"])
    return data_dir


# -- one run --


def log_times(path: str, started_at: float) -> dict:
    """Seconds from the start of ``train`` to the milestones the master logs (1 s resolution),
    and how long each worker took from its launch to its Register."""
    marks: dict = {"replacements": []}
    launched: dict[str, float] = {}
    day = time.strftime("%Y-%m-%d ", time.localtime(started_at))

    def at(line: str) -> float:
        stamp = time.mktime(time.strptime(day + line[:8], "%Y-%m-%d %H:%M:%S"))
        return round(stamp - started_at, 1)

    with open(path, errors="replace") as f:
        for line in f:
            if len(line) < 9 or line[2] != ":" or line[5] != ":":
                continue
            text = line[9:].split(None, 1)[-1].rstrip()
            if text.startswith("starting ") and "workers" in text:
                marks["master_ready_s"] = at(line)
            elif text.startswith("launched worker-"):
                launched[text.split()[1]] = at(line)
            elif " registered (pid " in text and text.startswith("worker-"):
                name = text.split()[0]
                if name in launched:
                    start = round(at(line) - launched[name], 1)
                    if int(name.rsplit("-", 1)[1]) >= 2:  # not one of the first two
                        marks["replacements"].append({"worker": name, "start_s": start})
                    else:
                        marks.setdefault("first_workers_start_s", []).append(start)
            elif TRAINED_LINE in text:
                marks["trained_s"] = at(line)
            elif text.startswith("done: "):
                marks["done_s"] = at(line)
    return marks


def read_status(output: str) -> dict:
    try:
        with open(os.path.join(output, "status.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def live_members(status: dict) -> dict[str, int]:
    return {
        m["id"]: m["pid"]
        for m in status.get("workers", []) + status.get("ps", [])
        if m["state"] in ("pending", "running") and m["pid"]
    }


class Killer:
    """Every ``every`` seconds from the start of the run, SIGKILLs one running worker."""

    def __init__(self, output: str, log_path: str, every: float, rng: random.Random) -> None:
        self.output = output
        self.log_path = log_path
        self.every = every
        self.rng = rng
        self.kills: list[dict] = []
        self.skipped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="killer", daemon=True)

    def start(self, started: float) -> None:
        self._started = started
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _saving(self) -> bool:
        """Whether the master logged that training is over (status.json goes stale then)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return TRAINED_LINE in f.read()
        except OSError:
            return False

    def _run(self) -> None:
        next_kill = self._started + self.every
        while not self._stop.wait(max(0.0, next_kill - time.monotonic())):
            # A worker that runs (its replacement may still be starting); wait for one.
            while not self._stop.is_set():
                status = read_status(self.output)
                if status.get("phase") not in (None, "starting", "running"):
                    return  # the job is over: nothing to kill
                progress = status.get("progress", {})
                if status.get("epoch") == status.get("epochs") and progress.get("fraction") == 1:
                    return  # trained: the job is saving the model, and kills count no more
                # The master writes status.json every second, except while it saves the model
                # at the end: a stale one means training is over (or the master is stuck).
                fresh = time.time() - status.get("updated_at", 0) < STALE_STATUS_S
                if self._saving():
                    return
                running = [m for m in status.get("workers", []) if m["state"] == "running"]
                if status.get("phase") == "running" and running and fresh:
                    break
                self._stop.wait(0.2)
            else:
                return
            victim = self.rng.choice(running)
            at = time.monotonic() - self._started
            try:
                os.kill(victim["pid"], signal.SIGKILL)
            except ProcessLookupError:
                self.skipped += 1  # it ended between the status write and now
                next_kill = time.monotonic() + 1.0
                continue
            self.kills.append(
                {
                    "at_s": round(at, 1),
                    "worker": victim["id"],
                    "epoch": status.get("epoch"),
                    "fraction": progress.get("fraction"),
                }
            )
            log(
                f"  killed {victim['id']} (pid {victim['pid']}) at {at:.1f} s, epoch "
                f"{status.get('epoch')} {progress.get('fraction', 0):.0%}"
            )
            next_kill += self.every


def run_job(args, data_dir: str, name: str, kill: bool) -> dict:
    from elastic_step.examples import path_of

    output = os.path.join(args.workdir, name)
    shutil.rmtree(output, ignore_errors=True)  # a leftover job would be resumed, not rerun
    command = [
        *elastic_step_command(),
        "train",
        "--model-def",
        path_of("digits"),
        "--data",
        data_dir,
        "--output",
        output,
        "--workers",
        "2",
        "--ps",
        "1",
        "--epochs",
        str(args.epochs),
        "--batch-size",
        str(args.batch_size),
        "--records-per-task",
        str(args.records_per_task),
        "--seed",
        str(args.seed),
        "--max-restarts",
        str(args.max_restarts),
    ]
    log_path = os.path.join(args.workdir, f"{name}.master.log")
    log(f"{name}: " + " ".join(command[2:]))
    load_before = load_1min()
    busy0, cpu0 = machine_busy_s(), children_cpu_s()
    killer = Killer(output, log_path, args.kill_every, random.Random(args.seed)) if kill else None
    with open(log_path, "w") as master_log:
        started, started_at = time.monotonic(), time.time()
        process = subprocess.Popen(
            command, cwd=REPO, stdout=master_log, stderr=subprocess.STDOUT, text=True
        )
        if killer:
            killer.start(started)
        try:
            code = process.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            log(f"{name}: no end after {args.timeout:.0f} s; stopping it (SIGTERM)")
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=30)
        finally:
            wall = time.monotonic() - started
            if killer:
                killer.stop()
            # Nothing of this run may outlive it (its instances lead their own groups).
            for pid in live_members(read_status(output)).values():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
    busy, job_cpu = machine_busy_s() - busy0, children_cpu_s() - cpu0
    try:
        with open(os.path.join(output, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        summary = {}
    epochs = summary.get("epochs") or []
    exact = bool(epochs) and all(e["records_trained"] == e["records_expected"] for e in epochs)
    accuracy = (summary.get("metrics") or {}).get("accuracy")
    try:
        marks = log_times(log_path, started_at)
    except (OSError, ValueError):
        marks = {}
    result = {
        "exit_code": code,
        "wall_s": round(wall, 2),
        "accounting_exact": exact,
        "epochs": epochs,
        "accuracy": accuracy,
        "restarts": summary.get("restarts"),
        "restarts_by_reason": summary.get("restarts_by_reason"),
        "examples_per_second": summary.get("examples_per_second"),
        "milestones": marks,
        "kills": killer.kills if killer else [],
        "kill_attempts_missed": killer.skipped if killer else 0,
        "job_cpu_s": round(job_cpu, 1),
        "machine_busy_cores": round(busy / wall, 2),
        "other_cores": round((busy - job_cpu) / wall, 2),
        "load_before": load_before,
        "load_after": load_1min(),
        "output": output,
        "master_log": log_path,
    }
    log(
        f"{name}: exit {code} in {wall:.1f} s; accounting "
        f"{'exact' if exact else 'NOT exact'}; accuracy {accuracy}; "
        f"restarts {summary.get('restarts')}"
    )
    return result


def training_s(run: dict) -> float | None:
    m = run["milestones"]
    if "trained_s" in m and "master_ready_s" in m:
        return m["trained_s"] - m["master_ready_s"]
    return None


# -- main --


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Wall time of `elastic-step train` on the digits (2 workers, 1 PS) with a "
        "worker SIGKILLed every 20 s, against the same job undisturbed; target ratio <= 1.15.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--workdir",
        default=os.path.join(HERE, "results", "goodput"),
        help="scratch directory: the digits, both runs' outputs and logs, goodput.json",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=160,
        help="epochs of both runs: enough that even the undisturbed run lasts > 60 s and the "
        "faulty one sees 3 kills (an epoch of the digits takes 0.4-0.8 s here, depending on "
        "the load; start-up and the final save 5-15 s)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="for both runs")
    parser.add_argument("--records-per-task", type=int, default=64, help="for both runs")
    parser.add_argument("--seed", type=int, default=7, help="job seed (both runs); victims")
    parser.add_argument("--kill-every", type=float, default=20.0, help="seconds between kills")
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=1000,
        help="the job's --max-restarts: a SIGKILLed worker crashed, and counts toward it",
    )
    parser.add_argument(
        "--clean-runs",
        type=int,
        choices=[1, 2],
        default=1,
        help="undisturbed runs: 1 (before the faulty one), or 2 (before and after it; the "
        "ratio uses their mean, which evens out load that comes and goes)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="bound on each run, s")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start(args)
    log(f"load average {load_1min()} ({os.cpu_count()} CPUs); results in {args.workdir}")
    data_dir = prepare_data(args.workdir)

    clean = [run_job(args, data_dir, "clean", kill=False)]
    faulty = run_job(args, data_dir, "faulty", kill=True)
    if args.clean_runs == 2:
        clean.append(run_job(args, data_dir, "clean-after", kill=False))
    clean_wall = sum(r["wall_s"] for r in clean) / len(clean)
    ratio = faulty["wall_s"] / clean_wall if clean_wall else None

    print()
    print(
        f"== goodput: digits, 2 workers, 1 PS, {args.epochs} epochs, batch {args.batch_size}, "
        f"{args.records_per_task} records/task, seed {args.seed}; a worker SIGKILLed every "
        f"{args.kill_every:g} s in the faulty run =="
    )
    runs = [("clean", clean[0]), ("faulty", faulty), *(("clean-after", c) for c in clean[1:])]
    print(f"{'run':<14}{'wall s':>8}{'exit':>6}{'accounting':>12}{'accuracy':>10}  restarts")
    for name, r in runs:
        accuracy = "-" if r["accuracy"] is None else f"{r['accuracy']:.4f}"
        print(
            f"{name:<14}{r['wall_s']:>8.1f}{r['exit_code']:>6}"
            f"{'exact' if r['accounting_exact'] else 'NOT EXACT':>12}{accuracy:>10}  "
            f"{r['restarts']} {r['restarts_by_reason'] or ''}"
        )
    kills = faulty["kills"]
    print(
        f"kills: {len(kills)} ("
        + ", ".join(f"{k['worker']} at {k['at_s']:.0f} s" for k in kills)
        + ")"
    )
    if ratio is not None:
        verdict = "PASS" if ratio <= TARGET else "MISS"
        print(f"ratio faulty / clean wall time: {ratio:.3f}   target <= {TARGET}: {verdict}")
    training = {name: training_s(r) for name, r in runs}
    clean_training = [training_s(c) for c in clean]
    if training["faulty"] and all(clean_training):
        mean = sum(clean_training) / len(clean_training)
        print(
            f"training phase only (master up -> all epochs trained): faulty "
            f"{training['faulty']:.0f} s, clean {mean:.0f} s, ratio {training['faulty'] / mean:.3f}"
        )
    for name, r in runs:
        m = r["milestones"]
        replacements = ", ".join(
            f"{x['worker']} {x['start_s']:.0f} s" for x in m.get("replacements", [])
        )
        print(
            f"  {name}: master up at {m.get('master_ready_s')} s, trained at "
            f"{m.get('trained_s')} s, done at {m.get('done_s')} s (from the start of train)"
            + (f"; replacements launch -> Register: {replacements}" if replacements else "")
        )
    for name, r in runs:
        print(
            f"  {name}: job CPU {r['job_cpu_s']:.0f} s; machine {r['machine_busy_cores']:.2f} "
            f"cores busy, others {r['other_cores']:.2f}; load {r['load_before']} -> "
            f"{r['load_after']}"
        )
    document = {
        **run_header(),
        "settings": vars(args),
        "clean": clean,
        "faulty": faulty,
        "ratio": ratio,
        "target": TARGET,
        "meets_target": None if ratio is None else ratio <= TARGET,
    }
    path = os.path.join(args.workdir, "goodput.json")
    write_result(path, document)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
