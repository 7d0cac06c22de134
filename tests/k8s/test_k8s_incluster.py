"""In-cluster credentials: the ServiceAccount token volume, load_incluster_config(), RBAC."""

from __future__ import annotations

import uuid

from k8s_helpers import container_log, last_json_line, python_pod, wait_terminal
from kubernetes import client

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

IN_CLUSTER = f"""
import base64, errno, json, os
from kubernetes import client, config
from kubernetes.client.rest import ApiException
sa = "{SA_DIR}"
out = {{"files": sorted(os.listdir(sa)), "namespace": open(sa + "/namespace").read()}}
token = open(sa + "/token").read()
payload = token.split(".")[1]
out["claims"] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
out["ca"] = open(sa + "/ca.crt").read().startswith("-----BEGIN CERTIFICATE-----")
try:
    open(sa + "/token", "w")
    out["writable"] = True
except OSError as err:
    out["writable"] = errno.errorcode[err.errno]
out["host"] = os.environ["KUBERNETES_SERVICE_HOST"] + ":" + os.environ["KUBERNETES_SERVICE_PORT"]

config.load_incluster_config()
core = client.CoreV1Api()
def status(call):
    try:
        call()
        return 200
    except ApiException as err:
        return err.status
ns = out["namespace"]
out["list pods"] = status(lambda: core.list_namespaced_pod(ns))
out["list secrets"] = status(lambda: core.list_namespaced_secret(ns))
out["list pods in default"] = status(lambda: core.list_namespaced_pod("default"))
review = client.AuthenticationV1Api().create_self_subject_review({{}})
out["user"] = review.status.user_info.username
print(json.dumps(out), flush=True)
"""

NO_TOKEN = f"""
import json, os
print(json.dumps({{"exists": os.path.exists("{SA_DIR}"),
                   "token": os.path.exists("{SA_DIR}/token")}}), flush=True)
"""


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_service_account_token_works_with_load_incluster_config(cluster, sa_api) -> None:
    core = client.CoreV1Api(sa_api)
    ns, name = cluster.namespace, _name("incluster")
    pod = python_pod(name, IN_CLUSTER, serviceAccountName="elastic-step-master")
    created = core.create_namespaced_pod(ns, pod)
    done = wait_terminal(core, ns, name)
    log = container_log(cluster.workdir, done)
    assert done.status.phase == "Succeeded", log
    out = last_json_line(log)

    assert {"token", "ca.crt", "namespace"} <= set(out["files"])
    assert out["namespace"] == ns
    assert out["ca"] is True
    assert out["writable"] == "EROFS"  # the token volume is read-only
    assert out["host"].startswith("127.0.0.1:")
    # A real TokenRequest token, bound to this pod.
    claims = out["claims"]["kubernetes.io"]
    assert claims["namespace"] == ns
    assert claims["serviceaccount"]["name"] == "elastic-step-master"
    assert claims["pod"] == {"name": name, "uid": created.metadata.uid}
    assert out["user"] == f"system:serviceaccount:{ns}:elastic-step-master"
    # RBAC applies: manifests/rbac.yaml lets the master list pods in its namespace only.
    assert out["list pods"] == 200
    assert out["list secrets"] == 403
    assert out["list pods in default"] == 403


def test_automount_false_leaves_no_token(cluster, sa_api, admin_api) -> None:
    core = client.CoreV1Api(sa_api)
    ns = cluster.namespace
    # Off on the pod ...
    on_pod = _name("no-token")
    core.create_namespaced_pod(ns, python_pod(on_pod, NO_TOKEN, automountServiceAccountToken=False))
    # ... and off on its ServiceAccount.
    account = _name("quiet-sa")
    admin = client.CoreV1Api(admin_api)
    admin.create_namespaced_service_account(
        ns, {"metadata": {"name": account}, "automountServiceAccountToken": False}
    )
    on_sa = _name("no-token-sa")
    core.create_namespaced_pod(ns, python_pod(on_sa, NO_TOKEN, serviceAccountName=account))
    for name in (on_pod, on_sa):
        pod = wait_terminal(core, ns, name)
        log = container_log(cluster.workdir, pod)
        assert pod.status.phase == "Succeeded", log
        assert last_json_line(log) == {"exists": False, "token": False}, name
    admin.delete_namespaced_service_account(account, ns)
