"""Two competing training jobs on one shared cluster: how long both take (the makespan), and
how much of the cluster they use, under gang scheduling, elastic scheduling, elastic
scheduling with priorities, and --auto-workers.

ElasticDL's headline experiment, on the project's test control plane (tests/cluster: a real
apiserver and scheduler, and the process kubelet, which enforces each pod's CPU limit as a
CFS quota). The node declares ``--capacity-jobs`` jobs' worth of CPU (default 1.5), so the
scheduler, not this machine's cores, rations the compute: the pods' limits add up to less
than the machine has.

Each policy runs two identical jobs, A and B: the digits, 1 PS and ``--workers`` M workers,
each pod ``--worker-cpu`` (requests = limits), ``--epochs`` epochs. Their masters run on this
machine, outside the cluster (as a pipeline step's master would run in a pod of its own that
this node does not hold), with the master's own RBAC. A arrives first; B arrives once A's M
workers all run, so A has its full size under every policy. Then:

- **gang**: ``--workers M --max-workers M`` and a gang wait in the bench: B is started only
  when the node has room for all of B (its PS and M workers);
- **elastic**: B is started at once with ``--workers M``: it runs with the pods that fit, the
  others wait Pending, and start as A's pods end;
- **priorities**: as elastic, and each job's PS and first half of its workers are at high
  priority (``--high-priority-fraction 0.5``, the shipped PriorityClasses): B's first
  workers preempt A's low-priority ones, and A goes on with fewer;
- **auto**: as elastic, each job with ``--workers 1 --max-workers M --auto-workers``: each
  master decides its own size from its examples/s and its Pending pods.

It reports, per policy: the makespan (A's arrival to the later job's end), each job's
pending time (arrival to its first Running worker) and duration, the mean CPU allocated
(the requests of the pods the scheduler placed, sampled every 0.5 s) and used (the node's
cpuacct counter), as fractions of the node's capacity, each job's accounting (records trained
= records expected in every epoch) and final accuracy. Then the ratios of each policy's
makespan to gang's. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "cluster"))
from common import (
    BenchError,
    accounting_exact,
    elastic_step_command,
    load_1min,
    log,
    machine_busy_s,
    run_header,
    start,
    wait_until,
    write_result,
)
from goodput import prepare_data
from kubernetes import client
from kubernetes.utils import parse_quantity
from local_cluster import Cluster, ClusterStartError, add_namespace, start_cluster

from elastic_step.backends import kubernetes_pods as pods

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NAMESPACE = "es-makespan"
POLICIES = ("gang", "elastic", "priorities", "auto")
SAMPLE_S = 0.5


@dataclass
class Job:
    """One job of a policy's pair, and what came of it."""

    name: str
    output: str
    arrived_s: float | None = None
    started_s: float | None = None  # its master started (gang: after the bench's wait)
    first_worker_s: float | None = None
    ended_s: float | None = None
    exit_code: int | None = None
    records_exact: bool | None = None
    accuracy: float | None = None
    restarts: dict[str, int] = field(default_factory=dict)
    sizing: list[dict] = field(default_factory=list)

    @property
    def pending_s(self) -> float | None:
        if self.first_worker_s is None or self.arrived_s is None:
            return None
        return round(self.first_worker_s - self.arrived_s, 1)


@dataclass
class PolicyRun:
    policy: str
    jobs: list[Job]
    makespan_s: float | None = None
    allocated: float | None = None  # mean fraction of the node's CPU requested by placed pods
    used: float | None = None  # mean fraction of the node's CPU its containers used
    #: The whole machine's busy cores over the makespan (masters, control plane, pods): near
    #: its core count, the machine and not the node's capacity rationed the compute.
    machine_cores: float | None = None
    error: str | None = None


class Sampler(threading.Thread):
    """Every SAMPLE_S: the CPU the placed pods of the namespace request, and the time each
    job's first worker ran."""

    def __init__(self, api: client.ApiClient, jobs: list[Job], started: float) -> None:
        super().__init__(daemon=True)
        self.core = client.CoreV1Api(api)
        self.jobs = jobs
        self.started = started
        self.samples: list[tuple[float, float]] = []  # (time, cores requested)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            now = time.monotonic() - self.started
            try:
                items = self.core.list_namespaced_pod(NAMESPACE, _request_timeout=10).items
            except Exception as e:  # a missed sample, not a failed bench
                log(f"sample missed: {e}")
                continue
            placed = _placed(items)
            self.samples.append((now, _requested(placed)))
            for job in self.jobs:
                if job.first_worker_s is None and any(
                    p.status.phase == "Running" and _job_of(p) == job.name and _is_worker(p)
                    for p in placed
                ):
                    job.first_worker_s = now

    def mean_allocated(self, until: float) -> float | None:
        """The time-weighted mean of the requested cores over [0, until]."""
        points = [(t, v) for t, v in self.samples if t <= until]
        if len(points) < 2:
            return None
        area = sum((t1 - t0) * v0 for (t0, v0), (t1, _) in itertools.pairwise(points))
        return area / (points[-1][0] - points[0][0])


PLACED = ("Pending", "Running")  # with a node: bound, starting or running


def _placed(items: list[client.V1Pod]) -> list[client.V1Pod]:
    """The pods the scheduler has bound to the node and that hold their requests."""
    return [p for p in items if p.spec.node_name and p.status.phase in PLACED]


def _requested(items: list[client.V1Pod]) -> float:
    """The CPU cores ``items`` request."""
    return sum(
        float(parse_quantity(((c.resources and c.resources.requests) or {}).get("cpu", "0")))
        for p in items
        for c in p.spec.containers
    )


def _job_cores(args: argparse.Namespace) -> float:
    """What one job requests: its PS and its M workers."""
    return float(parse_quantity(args.ps_cpu)) + args.workers * float(
        parse_quantity(args.worker_cpu)
    )


def _job_of(pod: client.V1Pod) -> str:
    return (pod.metadata.labels or {}).get(pods.LABEL_JOB, "")


def _is_worker(pod: client.V1Pod) -> bool:
    return (pod.metadata.labels or {}).get(pods.LABEL_ROLE) == "worker"


def job_flags(args: argparse.Namespace, policy: str) -> list[str]:
    m = str(args.workers)
    if policy == "gang":
        return ["--workers", m, "--max-workers", m]
    if policy == "elastic":
        return ["--workers", m]
    if policy == "priorities":
        return [
            "--workers", m, "--high-priority-fraction", "0.5",
            "--high-priority-class", "elastic-step-high",
            "--worker-priority-class", "elastic-step-low",
        ]  # fmt: skip
    return [
        "--workers", "1", "--max-workers", m, "--auto-workers",
        "--grow-after", str(args.grow_after),
    ]  # fmt: skip


def start_master(
    args: argparse.Namespace, policy: str, job: Job, kubeconfig: Path, data_dir: str
) -> subprocess.Popen:
    Path(job.output).parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(job.output, ignore_errors=True)
    command = [
        *elastic_step_command(), "train",
        "--model-def", str(REPO / "elastic_step" / "examples" / "digits.py"),
        "--data", data_dir, "--output", job.output, "--job-name", job.name,
        "--epochs", str(args.epochs), "--batch-size", "32", "--records-per-task", "64",
        "--seed", str(args.seed), "--backend", "kubernetes", "--kubeconfig", str(kubeconfig),
        "--namespace", NAMESPACE, "--image", "local/process",
        "--worker-cpu", args.worker_cpu, "--ps-cpu", args.ps_cpu,
        "--env", f"PYTHONPATH={REPO}", "--master-timeout", "900",
        *job_flags(args, policy),
    ]  # fmt: skip
    log_file = open(f"{job.output}.master.log", "w")  # noqa: SIM115 - the master's for its life
    return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO)


def free_cpu(core: client.CoreV1Api, capacity: float) -> float:
    return capacity - _requested(_placed(core.list_namespaced_pod(NAMESPACE).items))


def run_policy(
    args: argparse.Namespace, policy: str, cluster: Cluster, kubeconfig: Path, data_dir: str
) -> PolicyRun:
    capacity = float(parse_quantity(cluster.node_capacity["cpu"]))
    job_cores = _job_cores(args)
    jobs = [Job(f"mk-{policy}-{x}", str(Path(args.workdir) / policy / x)) for x in ("a", "b")]
    run = PolicyRun(policy, jobs)
    masters: dict[str, subprocess.Popen] = {}
    with cluster.admin() as api:
        core = client.CoreV1Api(api)
        wait_until(
            "an empty namespace",
            lambda: not core.list_namespaced_pod(NAMESPACE).items,
            120,
            interval=0.5,
        )
        started = time.monotonic()
        used0, busy0 = cluster.cpu_used_s(), machine_busy_s()
        sampler = Sampler(api, jobs, started)
        sampler.start()
        try:
            a, b = jobs
            a.arrived_s = a.started_s = 0.0
            masters[a.name] = start_master(args, policy, a, kubeconfig, data_dir)
            first_workers = 1 if policy == "auto" else args.workers

            def a_full() -> bool:
                running = [
                    p
                    for p in core.list_namespaced_pod(
                        NAMESPACE, label_selector=pods.job_selector(a.name)
                    ).items
                    if _is_worker(p) and p.status.phase == "Running"
                ]
                return len(running) >= first_workers

            wait_until(f"{a.name}'s workers running", a_full, 600, interval=0.5)
            b.arrived_s = round(time.monotonic() - started, 1)
            if policy == "gang":
                wait_until(
                    f"room for all of {b.name} ({job_cores:g} CPU)",
                    lambda: (
                        free_cpu(core, capacity) >= job_cores - 1e-6
                        or masters[a.name].poll() is not None
                    ),
                    args.timeout,
                    interval=0.5,
                )
            b.started_s = round(time.monotonic() - started, 1)
            masters[b.name] = start_master(args, policy, b, kubeconfig, data_dir)
            log(f"{policy}: {a.name} arrived at 0 s, {b.name} at {b.arrived_s} s, started at "
                f"{b.started_s} s")  # fmt: skip
            deadline = time.monotonic() + args.timeout
            while any(j.ended_s is None for j in jobs):  # each end timed as it comes
                if time.monotonic() > deadline:
                    raise BenchError(f"the jobs did not end in {args.timeout:.0f} s")
                for job in jobs:
                    code = masters[job.name].poll()
                    if job.ended_s is None and code is not None:
                        job.exit_code, job.ended_s = code, round(time.monotonic() - started, 1)
                        log(f"{policy}: {job.name} exited {code} at {job.ended_s} s")
                time.sleep(0.2)
        except BenchError as e:
            run.error = str(e)
            log(f"{policy}: {e}")
        finally:
            for master in masters.values():
                if master.poll() is None:
                    master.terminate()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        master.wait(timeout=60)
            sampler.stop.set()
            sampler.join(timeout=15)
    ends = [j.ended_s for j in jobs if j.ended_s is not None]
    if len(ends) == 2 and not run.error:
        run.makespan_s = max(ends)
        run.machine_cores = round((machine_busy_s() - busy0) / run.makespan_s, 2)
        mean = sampler.mean_allocated(run.makespan_s)
        run.allocated = None if mean is None else round(mean / capacity, 3)
        used = cluster.cpu_used_s()
        if used is not None and used0 is not None:
            run.used = round((used - used0) / (capacity * run.makespan_s), 3)
    for job in jobs:
        summary_path = Path(job.output) / "summary.json"
        if summary_path.exists():
            summary = json.loads(summary_path.read_text())
            job.records_exact = accounting_exact(summary["epochs"])
            job.accuracy = summary.get("metrics", {}).get("accuracy")
            job.restarts = summary.get("restarts", {})
            job.sizing = summary.get("worker_sizing", {}).get("decisions", [])
    return run


def print_table(runs: list[PolicyRun]) -> None:
    gang = next((r.makespan_s for r in runs if r.policy == "gang"), None)
    print()
    print(
        f"{'policy':<11} {'makespan':>9} {'/ gang':>7} {'CPU alloc':>9} {'CPU used':>9} "
        f"{'machine':>7}  "
        f"{'A pending':>9} {'A end':>7} {'B pending':>9} {'B end':>7}  accounting, accuracy"
    )
    for run in runs:
        a, b = run.jobs
        ratio = f"{run.makespan_s / gang:.3f}" if gang and run.makespan_s is not None else "-"
        exact = "exact" if all(j.records_exact for j in run.jobs) else "NOT EXACT"
        accuracy = ", ".join(f"{j.accuracy:.3f}" if j.accuracy else "-" for j in run.jobs)
        print(
            f"{run.policy:<11} {_s(run.makespan_s):>9} {ratio:>7} {_f(run.allocated):>9} "
            f"{_f(run.used):>9} {_f(run.machine_cores):>7}  {_s(a.pending_s):>9} "
            f"{_s(a.ended_s):>7} {_s(b.pending_s):>9} {_s(b.ended_s):>7}  {exact}, {accuracy}"
            + (f"  ERROR: {run.error}" if run.error else "")
        )
    for run in runs:
        for job in run.jobs:
            for d in job.sizing if run.policy == "auto" else []:
                print(f"  {job.name} at {d['at_s']:.0f} s: {d['action']} to {d['workers_to']}: "
                      f"{d['reason']}")  # fmt: skip


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}s"


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="The makespan of two competing training jobs on the test cluster (needs Go "
        "for its first build) under gang, elastic, elastic-with-priorities and --auto-workers "
        "scheduling, side by side, with the cluster CPU allocated and used.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--workdir",
        default=str(HERE / "results" / "makespan"),
        help="scratch directory: the digits, the cluster's files, each job's output and "
        "master log, makespan.json",
    )
    parser.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"comma-separated, run in this order (of {', '.join(POLICIES)})",
    )
    parser.add_argument("--workers", type=int, default=4, help="M: each job's workers")
    parser.add_argument("--worker-cpu", default="200m", help="each worker pod's CPU")
    parser.add_argument("--ps-cpu", default="200m", help="each PS pod's CPU")
    parser.add_argument(
        "--capacity-jobs",
        type=float,
        default=1.5,
        help="the node's CPU, in jobs (a job: its PS and M workers)",
    )
    parser.add_argument(
        "--epochs", type=int, default=60, help="each job's epochs (about 1.7 s each at full size)"
    )
    parser.add_argument(
        "--grow-after", type=float, default=5.0, help="auto: the measuring window, in seconds"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--timeout", type=float, default=1800, help="seconds a policy's pair may take"
    )
    args = parser.parse_args(argv)
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in args.policies if p not in POLICIES]
    if unknown or not args.policies:
        parser.error(f"--policies: unknown {unknown}; choose from {', '.join(POLICIES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start(args)
    # A SIGTERM unwinds like Ctrl-C: the masters and the cluster are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    workdir = Path(args.workdir)
    data_dir = prepare_data(str(workdir))
    job_cores = _job_cores(args)
    capacity_m = round(job_cores * args.capacity_jobs * 1000)
    log(
        f"load average {load_1min()} ({os.cpu_count()} CPUs); a job: 1 PS ({args.ps_cpu}) and "
        f"{args.workers} workers ({args.worker_cpu} each) = {job_cores:g} CPU; the node: "
        f"{capacity_m}m ({args.capacity_jobs:g} jobs); policies: {', '.join(args.policies)}"
    )
    cluster_dir = workdir / "cluster"
    shutil.rmtree(cluster_dir, ignore_errors=True)
    cluster_dir.mkdir(parents=True)
    runs: list[PolicyRun] = []
    load_before = load_1min()
    try:
        with start_cluster(
            cluster_dir, host_paths=[workdir], node_capacity={"cpu": f"{capacity_m}m"}
        ) as cluster:
            if cluster.cpu_used_s() is None:
                log("no cgroup-v1 cpuacct here: CPU used is not measured")
            kubeconfig = add_namespace(
                cluster.admin_kubeconfig, NAMESPACE, workdir / f"{NAMESPACE}-master.kubeconfig"
            )
            for policy in args.policies:
                log(f"{policy}: two jobs")
                runs.append(run_policy(args, policy, cluster, kubeconfig, data_dir))
    except ClusterStartError as e:
        log(f"the test cluster did not start: {e}")
        return 1
    print_table(runs)
    result = {
        **run_header(load_before=load_before, load_after=load_1min()),
        "settings": {
            "workers": args.workers,
            "worker_cpu": args.worker_cpu,
            "ps_cpu": args.ps_cpu,
            "node_cpu_m": capacity_m,
            "capacity_jobs": args.capacity_jobs,
            "epochs": args.epochs,
            "grow_after_s": args.grow_after,
        },
        "runs": [
            asdict(r) | {"jobs": [asdict(j) | {"pending_s": j.pending_s} for j in r.jobs]}
            for r in runs
        ],
    }
    write_result(str(workdir / "makespan.json"), result)
    log(f"wrote {workdir / 'makespan.json'}")
    return 1 if any(r.error for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
