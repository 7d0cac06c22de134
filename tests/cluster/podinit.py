"""Set up one container's private view of the machine, then exec its command.

The process kubelet starts every container as `python -I -S podinit.py PLAN.json`. This
helper, still with the container's pid, then:

1. joins the container's cgroups, memory, cpu and cpuacct (so the limits cover
   everything from here on);
2. unshares a mount namespace (propagation private) and a UTS namespace (the pod's
   hostname), unless the pod uses the host network (then only the mount namespace);
3. builds a new root: a tmpfs holding bind mounts of every top-level entry of the host's
   "/", and chroots into it. The host's files stay visible, but paths that do not exist on
   the host (a volume's mountPath such as /checkpoints, /var/run/secrets/...) can be
   created without touching the host: a directory that needs a new entry is "shadowed" by
   a tmpfs holding bind mounts of its original entries;
4. mounts the container's own directory on /tmp (plan["private_tmp"]), with the host paths
   under /tmp that it needs bound back (plan["keep"]: the interpreter, the repository, the
   pod's directory), so that two containers writing /tmp/outputs/... do not collide;
5. bind-mounts every volume, /etc/hosts, /etc/resolv.conf and /etc/hostname at their
   paths, read-only where asked;
6. changes to the working directory, takes the securityContext's user and groups if one is
   given, and execs the command with the container's env.

Nothing is mounted in the host's namespace: when the last process of the container exits,
the kernel drops the namespace and every mount in it. If any step fails, or the command
cannot be executed, the reason goes to plan["error_file"] (empty otherwise) and the exit
status is 128, which the kubelet reports as StartError (as a container runtime does).

Only the standard library is used (the helper runs with -I -S).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import socket
import stat
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

_libc = ctypes.CDLL("libc.so.6", use_errno=True)  # glibc; find_library costs 70 ms


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )


def umount_detach(target: str) -> None:
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


class Root:
    """The container's filesystem tree, built in a fresh mount namespace."""

    def __init__(self) -> None:
        # Directories that live on a tmpfs of ours: creating entries there is private.
        self.synthetic: set[str] = set()
        # Targets of directory volumes: creating entries there writes into the volume,
        # as a container runtime does for nested mount paths.
        self.volumes: list[str] = []
        #: Host paths under /tmp bound back into the container's /tmp (see _private_tmp).
        self.kept: list[str] = []
        self.stashes = 0

    def build(self, mountpoint: str) -> None:
        """Mount a tmpfs on mountpoint, fill it with the host's "/", and chroot into it."""
        mount("tmpfs", mountpoint, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
        self._populate(mountpoint, "/")
        os.chroot(mountpoint)
        os.chdir("/")
        self.synthetic.add("/")
        # The new root was itself visible under the host's tree when that was bound in;
        # drop that copy so the tree does not contain itself.
        if os.path.isdir(mountpoint):
            with contextlib.suppress(OSError):
                umount_detach(mountpoint)

    def _populate(self, target_dir: str, source_dir: str) -> None:
        for entry in sorted(os.listdir(source_dir)):
            source = os.path.join(source_dir, entry)
            target = os.path.join(target_dir, entry)
            st = os.lstat(source)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(source), target)
                continue
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(target, stat.S_IMODE(st.st_mode))
            else:
                with open(target, "w"):
                    pass
            mount(source, target, None, MS_BIND | MS_REC)

    def _writable(self, directory: str) -> bool:
        if directory in self.synthetic:
            return True
        return any(directory == v or directory.startswith(v + "/") for v in self.volumes)

    def _shadow(self, directory: str) -> None:
        """Replace a host directory by a tmpfs with bind mounts of its entries."""
        self.stashes += 1
        stash = f"/.podinit-stash-{self.stashes}"
        os.mkdir(stash)
        mount(directory, stash, None, MS_BIND | MS_REC)
        mode = stat.S_IMODE(os.stat(stash).st_mode)
        mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode:o},size=16m")
        self._populate(directory, stash)
        umount_detach(stash)
        os.rmdir(stash)
        self.synthetic.add(directory)

    def make_dir(self, path: str) -> str:
        """Ensure the directory exists without creating anything on the host; returns it."""
        path = os.path.realpath(path)
        if os.path.isdir(path):
            return path
        parent = self.make_dir(os.path.dirname(path))
        if os.path.lexists(path):  # a file or a dangling link where a directory is needed
            if not self._writable(parent):
                self._shadow(parent)
            os.unlink(path)
        elif not self._writable(parent):
            self._shadow(parent)
        os.mkdir(path, 0o755)
        if parent in self.synthetic:
            self.synthetic.add(path)
        return path

    def make_file(self, path: str) -> str:
        """Ensure a plain file (not a link) exists at path, to bind a file onto."""
        parent = self.make_dir(os.path.dirname(os.path.abspath(path)))
        path = os.path.join(parent, os.path.basename(path))
        if os.path.lexists(path) and not os.path.islink(path) and not os.path.isdir(path):
            return path
        if not self._writable(parent):
            self._shadow(parent)
        if os.path.lexists(path):
            if os.path.isdir(path) and not os.path.islink(path):
                raise OSError(f"{path} is a directory; cannot mount a file there")
            os.unlink(path)
        with open(path, "w"):
            pass
        return path

    def bind(self, source: str, target: str, read_only: bool) -> None:
        target = self.make_dir(target) if os.path.isdir(source) else self.make_file(target)
        mount(source, target, None, MS_BIND | MS_REC)
        if read_only:
            mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        if os.path.isdir(source):
            self.volumes.append(target)


def setup(plan: dict) -> None:
    for procs_file in plan.get("cgroup_procs", []):
        with open(procs_file, "w") as procs:
            procs.write(str(os.getpid()))
    unshare(CLONE_NEWNS | (CLONE_NEWUTS if plan.get("hostname") else 0))
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    if plan.get("hostname"):
        socket.sethostname(plan["hostname"])
    root = Root()
    root.build(plan["root"])
    host = (
        _private_tmp(root, plan["private_tmp"], plan.get("keep", []))
        if plan.get("private_tmp")
        else (lambda path: path)
    )
    # Parents before children, as a runtime mounts them: an emptyDir on /tmp does not hide
    # an artifact mounted at /tmp/inputs/x.
    mounts = sorted(plan.get("mounts", []), key=lambda m: os.path.normpath(m["target"]).count("/"))
    for item in mounts:
        try:
            root.bind(host(item["source"]), item["target"], bool(item.get("readOnly")))
        except OSError as err:
            raise OSError(f"mounting {item['source']} at {item['target']}: {err}") from err
    # The host paths kept under /tmp stand for volumes the tests share with their pods: a
    # volume mounted over them (an emptyDir on /tmp) must not hide them.
    targets = [os.path.normpath(m["target"]) for m in mounts]
    for path in root.kept:
        if any(path.startswith(t.rstrip("/") + "/") for t in targets):
            root.bind(host(path), path, False)
    # The directories the tests share with their pods outside /tmp too (a bench's workdir):
    # bound onto themselves, they are mount points a read-only root leaves writable.
    for path in sorted(set(plan.get("shared", []))):
        if not path.startswith("/tmp/") and os.path.isdir(path):
            root.bind(path, path, False)
            root.kept.append(path)
    if plan.get("private_tmp"):
        umount_detach(HOST_TMP)  # the binds made from it stay
        os.rmdir(HOST_TMP)
    os.chdir(root.make_dir(plan["cwd"]) if plan.get("cwd") else "/")
    if plan.get("read_only_root"):
        _read_only_root(mounts, root.kept)
    if "uid" in plan:  # securityContext.runAsUser/runAsGroup/supplementalGroups
        os.setgroups(plan.get("groups") or [])
        os.setgid(plan.get("gid", 0))
        os.setuid(plan["uid"])


HOST_TMP = "/.podinit-host-tmp"
#: What a runtime mounts apart from the image, and leaves writable under a read-only root.
KERNEL_MOUNTS = ("/dev", "/proc", "/sys")


def _read_only_root(mounts: list[dict], kept: list[str]) -> None:
    """securityContext.readOnlyRootFilesystem: every mount of the container's tree becomes
    read-only but its writable volumes and the kernel's own (/dev, /proc, /sys), as a
    runtime mounts the image read-only. /tmp too, unless a volume is mounted there. The
    host paths kept for the tests (``kept``) stay writable: they stand for shared volumes."""
    writable = {os.path.realpath(m["target"]) for m in mounts if not m.get("readOnly")}
    writable.update(kept)
    with open("/proc/self/mountinfo") as f:
        points = [_unescape(line.split()[4]) for line in f]
    for point in points:
        if point in writable or any(point == k or point.startswith(k + "/") for k in KERNEL_MOUNTS):
            continue
        try:
            mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        except OSError as err:
            # EINVAL, ENOENT: a mount that a later one hides (the path now reaches no mount
            # point, or nothing): out of the container's reach, so nothing to protect.
            if err.errno not in (errno.EINVAL, errno.ENOENT):
                raise


def _unescape(path: str) -> str:
    """A mount point as /proc/self/mountinfo writes it (space, tab, newline and backslash
    in octal)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        path = path.replace(code, char)
    return path


def _private_tmp(root: Root, private: str, keep: list[str]):
    """Mount the container's own directory on /tmp, as a container's /tmp is its image's,
    and bind back the host paths under /tmp that it needs (the interpreter, the repository,
    the pod's directory). Returns how a host path is reached from now on."""
    os.mkdir(HOST_TMP)
    mount("/tmp", HOST_TMP, None, MS_BIND | MS_REC)

    def host(path: str) -> str:
        if path == "/tmp" or path.startswith("/tmp/"):
            return HOST_TMP + path[len("/tmp") :]
        return path

    mount(host(private), "/tmp", None, MS_BIND | MS_REC)
    root.volumes.append("/tmp")  # entries made under /tmp go to the container's own directory
    kept: list[str] = []
    for path in sorted(set(keep)):
        if not path.startswith("/tmp/") or any(path.startswith(k + "/") for k in kept):
            continue
        if os.path.exists(host(path)):
            root.bind(host(path), path, False)
            kept.append(path)
    root.kept = kept
    return host


_error_fd = -1


def main() -> None:
    global _error_fd
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    try:
        # Opened now: after a switch to runAsUser the pod's directory may not be writable.
        _error_fd = os.open(plan["error_file"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.set_inheritable(_error_fd, False)
    except OSError:
        pass
    try:
        setup(plan)
    except Exception as err:  # any failure is a StartError
        _fail(plan, f"container setup failed: {err}")
    argv, env = plan["argv"], plan["env"]
    try:
        os.execve(_resolve(argv[0], env.get("PATH", os.defpath)), argv, env)
    except OSError as err:
        _fail(plan, f'exec: "{argv[0]}": {err.strerror or err}')


def _resolve(command: str, path: str) -> str:
    """The executable for command on PATH, found without importing anything more (after
    a switch to runAsUser the interpreter's own library may be out of reach)."""
    if "/" in command:
        return command
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", command)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(2, "executable file not found in $PATH")


def _fail(plan: dict, message: str) -> None:
    if _error_fd >= 0:
        with contextlib.suppress(OSError):
            os.write(_error_fd, message.encode())
    sys.stderr.write(message + "\n")
    os._exit(128)


if __name__ == "__main__":
    main()
