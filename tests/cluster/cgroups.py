"""cgroup-v1 groups for the test kubelet's containers: memory, cpu and cpuacct.

Each controller is its own hierarchy here (/sys/fs/cgroup/<controller>). The kubelet makes
one group per controller under the group it runs in, named with its pid so that a later
kubelet can sweep up after one that died, and one group per container under that. A
container joins all of its groups before it runs anything (podinit.py), so its limits cover
everything it starts:

- memory: ``resources.limits.memory`` is ``memory.limit_in_bytes`` (and ``memsw``, so no
  escape into swap); the kernel's OOM kills are counted;
- cpu: ``resources.limits.cpu`` is a CFS quota over a 100 ms period, as the real kubelet
  sets it (``cpu.cfs_quota_us`` = millicores x period / 1000, at least 1 ms);
- cpuacct: what a container used, and, in the kubelet's own group, what all of its
  containers ever used (the kernel charges a group's usage to its parents as it runs).

A controller that is not mounted, or where the kubelet cannot make groups, is skipped with a
warning: its limits are then not enforced.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("kubelet")

MOUNT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "cpu", "cpuacct")
CFS_PERIOD_US = 100_000
MIN_CFS_QUOTA_US = 1_000  # the kernel's floor, and the kubelet's


def kubelet_group(node_name: str, kubelet_pid: int) -> str:
    """The name of a kubelet's own groups (the pid lets a later kubelet sweep them up)."""
    return f"process-kubelet-{node_name}-{kubelet_pid}"


def node_cpu_usage_ns(node_name: str, kubelet_pid: int) -> int | None:
    """CPU time a running kubelet's containers have used so far, read from outside it."""
    parent = _own_groups(kubelet_pid).get("cpuacct", "").lstrip("/")
    return _usage_ns(MOUNT / "cpuacct" / parent / kubelet_group(node_name, kubelet_pid))


def cfs_quota_us(cpu_cores: float) -> int:
    """The CFS quota of a CPU limit, as the real kubelet computes it (MilliCPUToQuota)."""
    millis = math.ceil(cpu_cores * 1000)
    return max(MIN_CFS_QUOTA_US, millis * CFS_PERIOD_US // 1000)


@dataclass
class ContainerGroups:
    """A container's groups, one per controller that is enforced."""

    paths: dict[str, Path] = field(default_factory=dict)

    def procs_files(self) -> list[str]:
        """The files a process writes its pid to, to join every group."""
        return [str(path / "cgroup.procs") for path in self.paths.values()]

    def oom_kills(self) -> int:
        group = self.paths.get("memory")
        if group is None:
            return 0
        with contextlib.suppress(OSError, ValueError):
            for line in (group / "memory.oom_control").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def cpu_usage_ns(self) -> int | None:
        """CPU time the container's processes have used, in nanoseconds."""
        return _usage_ns(self.paths.get("cpuacct"))

    def kill_all(self) -> None:
        for group in self.paths.values():
            with contextlib.suppress(OSError):
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)

    def remove(self, attempts: int = 20) -> bool:
        """Kill what is left and remove the groups; False if one is still busy."""
        for controller, group in list(self.paths.items()):
            if not _remove(group, attempts):
                return False
            del self.paths[controller]
        return True


class NodeCgroups:
    """This kubelet's groups: one per controller, with its containers' groups inside."""

    def __init__(self, name: str):
        own = _own_groups(os.getpid())
        self.roots: dict[str, Path] = {}
        for controller in CONTROLLERS:
            parent = MOUNT / controller / own.get(controller, "").lstrip("/")
            if not (parent / "cgroup.procs").exists():
                log.warning("no cgroup-v1 %s controller at %s: not enforced", controller, parent)
                continue
            _sweep(parent, name.rsplit("-", 1)[0])
            try:
                (parent / name).mkdir(exist_ok=True)
            except OSError as err:
                log.warning("cannot create %s cgroup %s: %s", controller, parent / name, err)
                continue
            self.roots[controller] = parent / name

    def create(
        self, key: str, *, memory_bytes: int | None, cpu_cores: float | None
    ) -> ContainerGroups:
        """The groups of one container, with its limits set; empty where none is enforced."""
        groups = ContainerGroups()
        for controller, root in self.roots.items():
            group = root / key
            group.mkdir(exist_ok=True)
            groups.paths[controller] = group
        try:
            if memory_bytes is not None and "memory" in groups.paths:
                memory = groups.paths["memory"]
                (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
                memsw = memory / "memory.memsw.limit_in_bytes"
                if memsw.exists():
                    with contextlib.suppress(OSError):
                        memsw.write_text(str(memory_bytes))
            if cpu_cores is not None and "cpu" in groups.paths:
                cpu = groups.paths["cpu"]
                (cpu / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
                (cpu / "cpu.cfs_quota_us").write_text(str(cfs_quota_us(cpu_cores)))
        except OSError:
            groups.remove()
            raise
        return groups

    def cpu_usage_ns(self) -> int | None:
        """CPU time every container of this kubelet has used so far, those gone included."""
        return _usage_ns(self.roots.get("cpuacct"))

    def close(self) -> None:
        for root in self.roots.values():
            for group in list(root.iterdir()):
                if group.is_dir():
                    _remove(group)
            with contextlib.suppress(OSError):
                root.rmdir()


def _own_groups(pid: int) -> dict[str, str]:
    """The group process ``pid`` is in, per controller (from /proc/<pid>/cgroup)."""
    own: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(","):
                own[controller] = path
    return own


def _usage_ns(group: Path | None) -> int | None:
    if group is None:
        return None
    try:
        return int((group / "cpuacct.usage").read_text())
    except (OSError, ValueError):
        return None


def _sweep(parent: Path, prefix: str) -> None:
    """Remove groups left by kubelets that died without cleaning up (pid in the name)."""
    for group in parent.glob(f"{prefix}-*"):
        pid = group.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            for child in sorted(group.rglob("*"), key=lambda p: -len(p.parts)):
                if child.is_dir():
                    _remove(child, attempts=5)  # kills what it still holds
            with contextlib.suppress(OSError):
                group.rmdir()


def _remove(group: Path, attempts: int = 20) -> bool:
    """Kill what is left in ``group`` and remove it; False if it is still busy."""
    if not group.exists():
        return True
    for _ in range(attempts):
        with contextlib.suppress(OSError):
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        try:
            group.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.05)
    return False
