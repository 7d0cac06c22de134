"""CPU limits as a real kubelet enforces them: a container limited to a quarter core runs at a
quarter core, and the node counts what its containers used."""

from __future__ import annotations

import uuid

from k8s_helpers import container_log, last_json_line, python_pod, wait_terminal
from kubernetes import client

# Spins for WALL_S seconds of wall time and reports the share of a core it got, with what its
# own cpu group says: the quota it runs under and how often the kernel throttled it.
BUSY_LOOP = """
import json, os, time
WALL_S = 4.0
start, cpu_start = time.monotonic(), time.process_time()
while time.monotonic() - start < WALL_S:
    pass
fraction = (time.process_time() - cpu_start) / (time.monotonic() - start)
groups = dict(line.split(":", 2)[1:] for line in open("/proc/self/cgroup").read().splitlines())
cpu = "/sys/fs/cgroup/cpu" + groups["cpu"]
stat = dict(line.split() for line in open(cpu + "/cpu.stat").read().splitlines())
print(json.dumps({
    "fraction": fraction,
    "quota_us": int(open(cpu + "/cpu.cfs_quota_us").read()),
    "period_us": int(open(cpu + "/cpu.cfs_period_us").read()),
    "throttled": int(stat["nr_throttled"]),
}), flush=True)
"""


def test_a_pod_limited_to_a_quarter_core_runs_at_a_quarter_core(cluster, sa_api) -> None:
    core = client.CoreV1Api(sa_api)
    ns, suffix = cluster.namespace, uuid.uuid4().hex[:6]
    limited, free = f"cpu-quarter-{suffix}", f"cpu-free-{suffix}"
    used_before = cluster.cpu_used_s()
    quarter = {"cpu": "250m", "memory": "256Mi"}
    core.create_namespaced_pod(
        ns, python_pod(limited, BUSY_LOOP, resources={"requests": quarter, "limits": quarter})
    )
    # The control, beside it: the same loop without a CPU limit gets far more.
    core.create_namespaced_pod(
        ns, python_pod(free, BUSY_LOOP, resources={"requests": {"cpu": "250m"}})
    )
    results = {}
    for name in (limited, free):
        pod = wait_terminal(core, ns, name, timeout=120)
        assert pod.status.phase == "Succeeded", container_log(cluster.workdir, pod)
        results[name] = last_json_line(container_log(cluster.workdir, pod))

    quartered = results[limited]
    assert (quartered["quota_us"], quartered["period_us"]) == (25_000, 100_000)
    assert quartered["throttled"] > 0
    # 0.25 of a core; less only if the two cores here are busy with something else.
    assert 0.12 <= quartered["fraction"] <= 0.3, quartered
    unlimited = results[free]
    assert unlimited["quota_us"] == -1 and unlimited["throttled"] == 0
    assert unlimited["fraction"] > 0.45, unlimited

    # The node's own counter holds both loops' time, though their groups are gone.
    used = cluster.cpu_used_s() - used_before
    assert used >= 4.0 * (quartered["fraction"] + unlimited["fraction"]) * 0.9, used
