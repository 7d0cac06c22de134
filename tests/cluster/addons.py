"""Cluster add-ons of the test cluster: DNS and a volume provisioner, in one process.

What CoreDNS and a local-path provisioner are in a real cluster:

- cluster DNS (clusterdns.py) on UDP/TCP port 53 of --dns-address, answering from
  EndpointSlices; kubernetes.default.svc.<domain> answers with the apiserver's address;
- a provisioner for PersistentVolumeClaims: it makes StorageClass "process-local" the
  default class and, for every PVC that is Pending without a volume (whatever its class), creates a
  hostPath PersistentVolume at <pvc root>/<namespace>/<claim>, pre-bound to the claim; the
  controller-manager's PV binder then binds the two, as it does for any provisioner. A
  Released PV it made with reclaim policy Delete is deleted with its directory.

It writes --ready-file once DNS answers and the StorageClass exists, and exits when its
parent dies or on SIGTERM.

Run: python tests/cluster/addons.py --kubeconfig admin.kubeconfig --dns-address 127.1.255.53
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parent))
import contextlib

from clusterdns import DNSServer, Records, follow_endpoint_slices

log = logging.getLogger("cluster-addons")

STORAGE_CLASS = "process-local"
PROVISIONER = "elastic-step.test/process-local"


class Provisioner:
    """Creates a hostPath PV for every unbound PVC, and deletes released ones it made."""

    def __init__(self, api: client.ApiClient, root: Path, stopping: threading.Event):
        self.core = client.CoreV1Api(api)
        self.storage = client.StorageV1Api(api)
        self.root = root
        self.stopping = stopping

    def ensure_storage_class(self) -> None:
        body = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        }
        try:
            self.storage.create_storage_class(body)
        except ApiException as err:
            if err.status != 409:
                raise

    def claim_dir(self, namespace: str, name: str) -> Path:
        return self.root / namespace / name

    def provision(self, pvc: dict[str, Any]) -> None:
        meta, spec = pvc["metadata"], pvc.get("spec") or {}
        if spec.get("volumeName") or meta.get("deletionTimestamp"):
            return
        if (pvc.get("status") or {}).get("phase", "Pending") != "Pending":
            return
        if spec.get("volumeMode", "Filesystem") != "Filesystem":
            log.warning("PVC %s/%s: only Filesystem volumes", meta["namespace"], meta["name"])
            return
        path = self.claim_dir(meta["namespace"], meta["name"])
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)  # as local-path provisioners do: any container user may write
        size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
        cls = spec.get("storageClassName") or ""
        reclaim = "Delete"
        if cls and cls != STORAGE_CLASS:
            with contextlib.suppress(ApiException):
                reclaim = self.storage.read_storage_class(cls).reclaim_policy or "Delete"
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": f"pvc-{meta['uid']}",
                "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
            },
            "spec": {
                "capacity": {"storage": size},
                "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": reclaim,
                "storageClassName": cls,
                "volumeMode": "Filesystem",
                "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        try:
            self.core.create_persistent_volume(pv)
            log.info(
                "provisioned %s for %s/%s at %s",
                pv["metadata"]["name"],
                meta["namespace"],
                meta["name"],
                path,
            )
        except ApiException as err:
            if err.status != 409:
                raise

    def reclaim(self, pv: dict[str, Any]) -> None:
        meta, spec = pv["metadata"], pv.get("spec") or {}
        mine = (meta.get("annotations") or {}).get("pv.kubernetes.io/provisioned-by") == PROVISIONER
        released = (pv.get("status") or {}).get("phase") == "Released"
        if not (mine and released and spec.get("persistentVolumeReclaimPolicy") == "Delete"):
            return
        path = Path((spec.get("hostPath") or {}).get("path", ""))
        if path.is_relative_to(self.root):
            shutil.rmtree(path, ignore_errors=True)
        try:
            self.core.delete_persistent_volume(meta["name"])
            log.info("deleted released %s", meta["name"])
        except ApiException as err:
            if err.status != 404:
                raise

    def _follow(self, list_call: Any, handle: Any) -> None:
        while not self.stopping.is_set():
            try:
                data = json.loads(list_call(_preload_content=False).data)
                for item in data["items"]:
                    handle(item)
                stream = watch.Watch().stream(
                    list_call,
                    resource_version=data["metadata"]["resourceVersion"],
                    timeout_seconds=30,
                )
                for event in stream:
                    if self.stopping.is_set():
                        return
                    if event["type"] in ("ADDED", "MODIFIED"):
                        handle(event["raw_object"])
            except ApiException as err:
                if err.status != 410:
                    log.warning("watch failed: %s", err)
                    self.stopping.wait(1)
            except Exception:
                log.exception("watch failed")
                self.stopping.wait(1)

    def start(self) -> None:
        follow = [
            (self.core.list_persistent_volume_claim_for_all_namespaces, self.provision),
            (self.core.list_persistent_volume, self.reclaim),
        ]
        for list_call, handle in follow:
            threading.Thread(target=self._follow, args=(list_call, handle), daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--dns-address", required=True, help="loopback address for port 53")
    parser.add_argument("--dns-port", type=int, default=53)
    parser.add_argument("--cluster-domain", default="cluster.local")
    parser.add_argument("--pvc-root", required=True, help="directory for provisioned volumes")
    parser.add_argument("--ready-file", default="")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s addons %(message)s")
    api = config.new_client_from_config(config_file=args.kubeconfig)
    apiserver = urlsplit(api.configuration.host).hostname or "127.0.0.1"
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())

    records = Records(
        args.cluster_domain, static={f"kubernetes.default.svc.{args.cluster_domain}": [apiserver]}
    )
    server = DNSServer(records, args.dns_address, args.dns_port)
    server.start()
    threading.Thread(
        target=follow_endpoint_slices, args=(api, records, stopping), daemon=True
    ).start()
    provisioner = Provisioner(api, Path(args.pvc_root), stopping)
    provisioner.ensure_storage_class()
    provisioner.start()
    log.info("DNS on %s:%s (udp+tcp); PVs under %s", *server.address, args.pvc_root)
    if args.ready_file:
        tmp = Path(args.ready_file + ".tmp")
        tmp.write_text(json.dumps({"dns": server.address[0], "port": server.address[1]}))
        os.replace(tmp, args.ready_file)

    parent = os.getppid()
    while not stopping.wait(1):
        if os.getppid() != parent:  # the test run died without stopping us
            break
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
