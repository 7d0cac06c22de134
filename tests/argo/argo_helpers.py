"""What the Argo tests share: workflows submitted as a user submits them (the ``argo`` CLI),
read back from the API, and the job's pods as the master made them."""

from __future__ import annotations

import copy
import hashlib
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from argo import WORKFLOW_TEMPLATE, Argo
from kubernetes import client
from local_cluster import container_log, log_tail, wait_for

from elastic_step.backends import kubernetes_pods as pods

GROUP, VERSION = "argoproj.io", "v1alpha1"
#: A model with a least time per training batch: a job outlives what a test does while it
#: runs, however fast training has become.
PACED_MODEL = Path(__file__).parents[1] / "cluster" / "paced_model.py"
SERVICE_ACCOUNT = "elastic-step-master"
ENDED = ("Succeeded", "Failed", "Error")
#: What the example's steps read the object store with (tests/argo/conftest.py): the main
#: container's env from the Secret, in the master (podSpecPatch) and its workers (pod template).
_STORAGE_ENV = {"name": "main", "envFrom": [{"secretRef": {"name": "elastic-step-storage"}}]}
STORAGE_PATCH = yaml.safe_dump({"containers": [_STORAGE_ENV]})
POD_TEMPLATE = yaml.safe_dump({"spec": {"containers": [_STORAGE_ENV]}})
#: A launcher that swallows signals, standing in for KFP's: it ignores SIGTERM, passes
#: nothing on, and runs the command in a session of its own (so a signal to its group
#: misses it too), then exits with the command's status.
SWALLOWING_LAUNCHER = """
import signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("launcher: running", sys.argv[1:], "and ignoring SIGTERM", flush=True)
sys.exit(subprocess.call(sys.argv[1:], start_new_session=True))
"""


def submit(argo: Argo, manifest: Path | dict, **parameters: str) -> str:
    """``argo submit`` with the project's ServiceAccount (as ``--serviceaccount`` does);
    the new Workflow's name."""
    if isinstance(manifest, dict):
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump(manifest, f)
        manifest = Path(f.name)
    args = ["submit", str(manifest), "--serviceaccount", SERVICE_ACCOUNT, "-o", "name"]
    for name, value in parameters.items():
        args += ["-p", f"{name}={value}"]
    return argo.cli(*args).strip()


def read_workflow(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, "workflows", name
    )


def wait_until_ended(api: client.ApiClient, ns: str, name: str, timeout: float) -> dict:
    def ended() -> dict | None:
        workflow = read_workflow(api, ns, name)
        return workflow if workflow.get("status", {}).get("phase") in ENDED else None

    return wait_for(f"workflow {name} to end", ended, timeout=timeout, interval=1.0)


def nodes_named(workflow: dict, display_name: str) -> list[dict]:
    """The workflow's nodes shown as ``display_name`` (a retried step has a Retry node and
    one Pod node per attempt, ``name(0)``, ``name(1)``...)."""
    nodes = workflow.get("status", {}).get("nodes", {}).values()
    return [n for n in nodes if n.get("displayName", "").split("(")[0] == display_name]


def job_name(workflow: dict, task: str) -> str:
    """The --job-name that the templates derive for a DAG task of ``workflow``."""
    node = f"{workflow['metadata']['name']}.{task}"
    digest = hashlib.sha256(f"{workflow['metadata']['uid']}/{node}".encode()).hexdigest()
    return f"es-{digest[:12]}"


def job_pods(core: client.CoreV1Api, ns: str, job: str) -> list[str]:
    listed = core.list_namespaced_pod(ns, label_selector=pods.job_selector(job))
    return sorted(p.metadata.name for p in listed.items)


def read_json(s3_server, bucket: str, key: str) -> dict:
    return json.loads(s3_server.read(bucket, key))


def train_only_workflow(
    data: str, output: str, *, epochs: int, launcher: bool = False, **parameters: str
) -> dict:
    """A Workflow of one task, the training step of :data:`PACED_MODEL` in batches of 4, on
    data already preprocessed: the WorkflowTemplate's elastic-train by templateRef, or with
    ``launcher`` a copy of it whose command runs below :data:`SWALLOWING_LAUNCHER`."""
    model_def = PACED_MODEL.read_text()
    arguments = {
        "artifacts": [
            {"name": "model-def", "raw": {"data": model_def}},
            {"name": "pod-template", "raw": {"data": POD_TEMPLATE}},
        ],
        "parameters": [
            {"name": name, "value": str(value)}
            for name, value in {
                "data": data,
                "output": output,
                "epochs": epochs,
                "workers": 2,
                "ps": 1,
                "records-per-task": 64,
                "batch-size": 4,
                **parameters,
            }.items()
        ],
    }
    task: dict[str, Any] = {"name": "train", "arguments": arguments}
    templates: list[dict] = []
    if launcher:
        template = copy.deepcopy(_template("elastic-train"))
        template["name"] = "elastic-train-launched"
        command = template["container"]["command"]
        template["container"]["command"] = [sys.executable, "-c", SWALLOWING_LAUNCHER, *command]
        templates.append(template)
        task["template"] = template["name"]
    else:
        task["templateRef"] = {"name": "elastic-step", "template": "elastic-train"}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workflow",
        "metadata": {"generateName": "es-train-"},
        "spec": {
            "entrypoint": "main",
            "podSpecPatch": STORAGE_PATCH,
            "templates": [{"name": "main", "dag": {"tasks": [task]}}, *templates],
        },
    }


def _template(name: str) -> dict:
    document = yaml.safe_load(WORKFLOW_TEMPLATE.read_text())
    return next(t for t in document["spec"]["templates"] if t["name"] == name)


class PodRecorder:
    """Records every pod of a job, and when each was last seen, polling in a thread: what
    the master made, whatever it deletes later."""

    def __init__(self, api: client.ApiClient, ns: str, job: str) -> None:
        self._core = client.CoreV1Api(api)
        self._ns, self._job = ns, job
        self.seen: dict[str, dict[str, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def roles(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for labels in self.seen.values():
            counts[labels[pods.LABEL_ROLE]] = counts.get(labels[pods.LABEL_ROLE], 0) + 1
        return counts

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        selector = pods.job_selector(self._job)
        while not self._stop.wait(0.5):
            try:
                listed = self._core.list_namespaced_pod(self._ns, label_selector=selector)
            except Exception:  # the next poll tries again
                continue
            for pod in listed.items:
                self.seen.setdefault(pod.metadata.name, dict(pod.metadata.labels or {}))


def wait_for_training(s3_server, bucket: str, output_key: str, version: int, timeout: float):
    """Waits until the job's status.json (under the s3 prefix ``output_key``) shows at least
    model ``version``; returns the status."""

    def training() -> dict | None:
        try:
            status = read_json(s3_server, bucket, f"{output_key}/status.json")
        except Exception:
            return None
        return status if status.get("model_version", 0) >= version else None

    return wait_for("training under way", training, timeout=timeout, interval=1.0)


def seconds_until(check, timeout: float) -> float:
    """Seconds until ``check()`` is true (polled every 0.2 s)."""
    started = time.monotonic()
    wait_for("the condition", check, timeout=timeout)
    return time.monotonic() - started


def step_pods(core: client.CoreV1Api, ns: str, workflow: str) -> list[client.V1Pod]:
    """The workflow's own step pods (Argo labels them with the workflow's name)."""
    selector = f"workflows.argoproj.io/workflow={workflow}"
    return core.list_namespaced_pod(ns, label_selector=selector).items


def explain(argo: Argo, api: client.ApiClient, name: str) -> str:
    """For an assertion's message: each node's phase and message, the step pods' last log
    lines, and the controller's."""
    workflow = read_workflow(api, argo.namespace, name)
    status = workflow.get("status", {})
    lines = [f"workflow {name}: {status.get('phase')} {status.get('message', '')}"]
    for node in status.get("nodes", {}).values():
        lines.append(f"  node {node['displayName']}: {node['phase']} {node.get('message', '')}")
    for pod in step_pods(client.CoreV1Api(api), argo.namespace, name):
        for container in ("init", "wait", "main"):
            try:
                text = container_log(argo.cluster.workdir, pod, container)
            except OSError:
                continue
            lines.append(
                f"--- {pod.metadata.name}/{container}\n" + "\n".join(text.splitlines()[-25:])
            )
    lines.append("--- workflow-controller\n" + log_tail(argo.log, 25))
    return "\n".join(lines)
