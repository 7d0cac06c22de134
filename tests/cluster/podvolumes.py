"""A pod's volumes as host directories, and each container's mounts of them.

The kubelet calls prepare_volumes() once per pod, before any container starts: every
volume becomes a directory (or, for a hostPath file, a file) on the host, and
container_mounts() turns a container's volumeMounts into (source, target, readOnly)
entries for podinit.py to bind in the container's mount namespace.

- emptyDir: <pod dir>/volumes/<name>, created empty, removed with the pod's directory
  (medium and sizeLimit are ignored).
- configMap, secret, downwardAPI, projected: files written once into <pod dir>/volumes/
  <name> (keys or items, defaultMode/mode), always mounted read-only as the real kubelet
  does. A projected serviceAccountToken is a real TokenRequest bound to the pod; the
  kubelet rewrites it at 80% of its lifetime. ConfigMap and Secret changes after the start
  are not propagated.
- persistentVolumeClaim: the bound PersistentVolume's hostPath (or local.path); PVs the
  test cluster's provisioner creates live at <cluster dir>/pvc/<namespace>/<claim>, so every
  pod mounting a claim sees the same directory.
- hostPath: the host path itself (created for DirectoryOrCreate/FileOrCreate and unset).

Any other volume type is an error (a StartError for the pod).
"""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from podenv import expand, field_ref, resource_field_ref

DEFAULT_MODE = 0o644
TOKEN_SECONDS = 3600


class VolumeNotReady(Exception):
    """Something a volume needs is missing (yet): the kubelet retries, as a real one does."""


class VolumeSources(Protocol):
    """What volumes are made of; the kubelet implements it with the API."""

    def config_map(self, namespace: str, name: str) -> dict[str, bytes] | None: ...

    def secret(self, namespace: str, name: str) -> dict[str, bytes] | None: ...

    def token(
        self, pod: Mapping[str, Any], audience: str | None, seconds: int
    ) -> tuple[str, float]:
        """A token for the pod's ServiceAccount bound to the pod: (token, expiry epoch)."""
        ...

    def claim_path(self, namespace: str, claim: str) -> Path: ...


@dataclass
class TokenFile:
    """A projected service-account token the kubelet keeps fresh."""

    path: Path
    audience: str | None
    seconds: int
    issued: float
    expires: float

    def due(self, now: float) -> bool:
        lifetime = min(self.expires - self.issued, self.seconds)
        return now >= self.issued + 0.8 * lifetime


@dataclass
class Volume:
    path: Path
    api_data: bool = False  # configMap/secret/downwardAPI/projected: always read-only


@dataclass
class PodVolumes:
    volumes: dict[str, Volume] = field(default_factory=dict)
    tokens: list[TokenFile] = field(default_factory=list)


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Write atomically (a reader never sees half a token)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, path)


def _relative(path: str) -> str:
    parts = Path(path).parts
    if Path(path).is_absolute() or ".." in parts or not parts:
        raise ValueError(f"bad volume item path {path!r}")
    return path


def _keyed(
    target: Path,
    data: dict[str, bytes],
    items: list[dict[str, Any]] | None,
    mode: int,
    what: str,
    optional: bool,
) -> None:
    if items:
        for item in items:
            if item["key"] not in data:
                if optional:
                    continue
                raise VolumeNotReady(f"{what}: key {item['key']!r} not found")
            write_file(target / _relative(item["path"]), data[item["key"]], item.get("mode", mode))
    else:
        for key, value in data.items():
            write_file(target / key, value, mode)


def _downward(pod: Mapping[str, Any], target: Path, items: list[dict[str, Any]], mode: int) -> None:
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    for item in items:
        if "fieldRef" in item:
            path = item["fieldRef"]["fieldPath"]
            meta = pod.get("metadata", {})
            if path in ("metadata.labels", "metadata.annotations"):
                values = meta.get(path.split(".")[1]) or {}
                text = "\n".join(f'{k}="{v}"' for k, v in sorted(values.items()))
            else:
                text = field_ref(pod, path)
        elif "resourceFieldRef" in item:
            ref = item["resourceFieldRef"]
            container = containers.get(ref.get("containerName") or "", {})
            text = resource_field_ref(container, ref)
        else:
            continue
        write_file(target / _relative(item["path"]), text.encode(), item.get("mode", mode))


def _source_data(
    sources: VolumeSources, kind: str, namespace: str, ref: Mapping[str, Any], name_key: str
) -> dict[str, bytes] | None:
    name = ref.get(name_key, "")
    data = (sources.config_map if kind == "configMap" else sources.secret)(namespace, name)
    if data is None and not ref.get("optional"):
        raise VolumeNotReady(f"{kind} {name!r} not found")
    return data


def prepare_volumes(
    pod: Mapping[str, Any], pod_dir: Path, sources: VolumeSources, now: Callable[[], float]
) -> PodVolumes:
    """Materialise every volume of the pod; raises VolumeNotReady to be retried."""
    namespace = pod["metadata"]["namespace"]
    out = PodVolumes()
    for spec in pod["spec"].get("volumes") or []:
        name = spec["name"]
        target = pod_dir / "volumes" / name
        if "emptyDir" in spec:
            target.mkdir(parents=True, exist_ok=True)
            target.chmod(0o777)  # as the kubelet makes it: any container user may write
            out.volumes[name] = Volume(target)
        elif "configMap" in spec or "secret" in spec:
            kind = "configMap" if "configMap" in spec else "secret"
            ref = spec[kind]
            data = _source_data(
                sources, kind, namespace, ref, "name" if kind == "configMap" else "secretName"
            )
            target.mkdir(parents=True, exist_ok=True)
            mode = ref.get("defaultMode", DEFAULT_MODE)
            _keyed(target, data or {}, ref.get("items"), mode, kind, bool(ref.get("optional")))
            out.volumes[name] = Volume(target, api_data=True)
        elif "downwardAPI" in spec:
            target.mkdir(parents=True, exist_ok=True)
            ref = spec["downwardAPI"]
            _downward(pod, target, ref.get("items") or [], ref.get("defaultMode", DEFAULT_MODE))
            out.volumes[name] = Volume(target, api_data=True)
        elif "projected" in spec:
            target.mkdir(parents=True, exist_ok=True)
            projected = spec["projected"]
            mode = projected.get("defaultMode", DEFAULT_MODE)
            for source in projected.get("sources") or []:
                if "configMap" in source or "secret" in source:
                    kind = "configMap" if "configMap" in source else "secret"
                    ref = source[kind]
                    data = _source_data(sources, kind, namespace, ref, "name")
                    _keyed(
                        target, data or {}, ref.get("items"), mode, kind, bool(ref.get("optional"))
                    )
                elif "downwardAPI" in source:
                    _downward(pod, target, source["downwardAPI"].get("items") or [], mode)
                elif "serviceAccountToken" in source:
                    ref = source["serviceAccountToken"]
                    seconds = int(ref.get("expirationSeconds") or TOKEN_SECONDS)
                    audience = ref.get("audience") or None
                    token, expires = sources.token(pod, audience, seconds)
                    path = target / _relative(ref["path"])
                    write_file(path, token.encode(), mode)
                    out.tokens.append(TokenFile(path, audience, seconds, now(), expires))
                else:
                    raise ValueError(
                        f"volume {name!r}: unsupported projected source {list(source)}"
                    )
            out.volumes[name] = Volume(target, api_data=True)
        elif "persistentVolumeClaim" in spec:
            claim = spec["persistentVolumeClaim"]["claimName"]
            out.volumes[name] = Volume(sources.claim_path(namespace, claim))
        elif "hostPath" in spec:
            path = Path(spec["hostPath"]["path"])
            kind = spec["hostPath"].get("type") or ""
            if kind in ("", "DirectoryOrCreate") and not path.exists():
                path.mkdir(parents=True, exist_ok=True)
            elif kind == "FileOrCreate" and not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            elif not path.exists():
                raise VolumeNotReady(f"hostPath {path} does not exist")
            out.volumes[name] = Volume(path)
        else:
            kinds = [k for k in spec if k != "name"]
            raise ValueError(f"volume {name!r}: unsupported volume type {kinds}")
    return out


def refresh_token(
    token: TokenFile, pod: Mapping[str, Any], sources: VolumeSources, now: float
) -> None:
    value, expires = sources.token(pod, token.audience, token.seconds)
    write_file(token.path, value.encode(), stat.S_IMODE(token.path.stat().st_mode))
    token.issued, token.expires = now, expires


def container_mounts(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    volumes: PodVolumes,
    env: Mapping[str, str],
) -> list[dict[str, Any]]:
    """The container's volumeMounts as bind mounts: source on the host, target in the pod."""
    claims = {
        v["name"]: bool(v["persistentVolumeClaim"].get("readOnly"))
        for v in pod["spec"].get("volumes") or []
        if "persistentVolumeClaim" in v
    }
    mounts = []
    for vm in container.get("volumeMounts") or []:
        volume = volumes.volumes.get(vm["name"])
        if volume is None:
            raise ValueError(f"volumeMount {vm['name']!r}: no such volume")
        source = volume.path
        sub = vm.get("subPath") or (expand(vm["subPathExpr"], env) if vm.get("subPathExpr") else "")
        if sub:
            source = source / _relative(sub)
            if not source.exists():
                if volume.api_data:
                    raise ValueError(f"subPath {sub!r} not found in volume {vm['name']!r}")
                source.mkdir(parents=True, exist_ok=True)
        read_only = bool(vm.get("readOnly")) or volume.api_data or claims.get(vm["name"], False)
        mounts.append({"source": str(source), "target": vm["mountPath"], "readOnly": read_only})
    # Parents before children, as the runtime mounts them.
    mounts.sort(key=lambda m: len(Path(m["target"]).parts))
    return mounts


def decode_secret(data: Mapping[str, str] | None) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (data or {}).items()}


def config_map_bytes(
    data: Mapping[str, str] | None, binary: Mapping[str, str] | None
) -> dict[str, bytes]:
    out = {k: v.encode() for k, v in (data or {}).items()}
    out.update({k: base64.b64decode(v) for k, v in (binary or {}).items()})
    return out
