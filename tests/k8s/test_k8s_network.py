"""Pod IPs and cluster DNS: pods listen on their own address and find each other by name."""

from __future__ import annotations

import ipaddress
import json
import socket
import struct
import time
import uuid

from k8s_helpers import (
    container_log,
    field_env,
    last_json_line,
    python_pod,
    wait_for,
    wait_running,
    wait_terminal,
)
from kubernetes import client

PORT = 7000

SERVER = """
import json, os, socket
ip = os.environ["POD_IP"]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((ip, 7000))
srv.listen(16)
print(json.dumps({"listening": ip, "hostname": socket.gethostname()}), flush=True)
while True:
    conn, peer = srv.accept()
    with conn:
        conn.sendall(json.dumps({"server": ip, "hostname": socket.gethostname()}).encode())
"""

CLIENT = """
import json, os, socket, sys, time
svc, ns, expect = os.environ["SVC"], os.environ["POD_NAMESPACE"], int(os.environ["EXPECT"])
names = [svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local"]
out = {
    "resolv": open("/etc/resolv.conf").read(),
    "hostname": socket.gethostname(),
    "self": socket.gethostbyname(socket.gethostname()),
    "resolved": {},
}

def lookup(name):
    infos = socket.getaddrinfo(name, 7000, socket.AF_INET, socket.SOCK_STREAM)
    return sorted({i[4][0] for i in infos})

deadline = time.time() + 60
for name in names + [f"web-0.{svc}"]:
    want = 1 if name.startswith("web-0.") else expect
    while True:
        try:
            found = lookup(name)
        except socket.gaierror as err:
            found = str(err)
        if (isinstance(found, list) and len(found) == want) or time.time() > deadline:
            break
        time.sleep(0.2)
    out["resolved"][name] = found
out["replies"] = []
for address in out["resolved"][svc]:
    with socket.create_connection((address, 7000), timeout=10) as conn:
        out["replies"].append(json.loads(conn.makefile().read()))
with socket.create_connection((f"web-0.{svc}", 7000), timeout=10) as conn:
    out["by_hostname"] = json.loads(conn.makefile().read())
started = time.monotonic()
for name in ("no-such-service", "example.com"):
    try:
        socket.getaddrinfo(name, 80)
        out.setdefault("unexpected", []).append(name)
    except socket.gaierror:
        pass
out["nxdomain_seconds"] = time.monotonic() - started
print(json.dumps(out), flush=True)
"""


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _ready_endpoints(cluster, service: str) -> list[str]:
    # Raw JSON: the Python client cannot read a slice without endpoints (endpoints: null).
    with cluster.admin() as api:
        resp = client.DiscoveryV1Api(api).list_namespaced_endpoint_slice(
            cluster.namespace,
            label_selector=f"kubernetes.io/service-name={service}",
            _preload_content=False,
        )
    return sorted(
        address
        for eps in json.loads(resp.data)["items"]
        for endpoint in eps.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready")
        for address in endpoint["addresses"]
    )


def dns_query(server: str, name: str, tcp: bool = False, qtype: int = 1) -> tuple[int, list[str]]:
    """(rcode, A addresses) of one query to the cluster DNS server."""
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.strip(".").split(".")) + b"\0"
    query = (
        struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", qtype, 1)
    )
    if tcp:
        with socket.create_connection((server, 53), timeout=5) as sock:
            sock.sendall(struct.pack("!H", len(query)) + query)
            stream = sock.makefile("rb")
            reply = stream.read(struct.unpack("!H", stream.read(2))[0])
    else:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(5)
            sock.sendto(query, (server, 53))
            reply = sock.recv(4096)
    ident, flags, _, ancount = struct.unpack_from("!HHHH", reply, 0)
    assert ident == 0x1234 and flags & 0x8000
    offset = 12 + len(qname) + 4
    addresses = []
    for _ in range(ancount):
        offset += 2  # a pointer to the question's name
        rtype, _, _, rdlength = struct.unpack_from("!HHIH", reply, offset)
        offset += 10
        if rtype == 1:
            addresses.append(socket.inet_ntoa(reply[offset : offset + rdlength]))
        offset += rdlength
    return flags & 0xF, addresses


def test_pods_listen_on_their_own_ip_and_find_each_other_by_service_name(cluster, sa_api) -> None:
    core = client.CoreV1Api(sa_api)
    ns = cluster.namespace
    svc, app = _name("echo"), _name("web")
    # A headless Service, as elastic-step creates for its parameter servers.
    core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": svc, "labels": {"app.kubernetes.io/managed-by": "elastic-step"}},
            "spec": {"clusterIP": "None", "selector": {"app": app}, "ports": [{"port": PORT}]},
        },
    )
    servers = {"web-0": _name("web-0"), "web-1": _name("web-1")}
    for hostname, name in servers.items():
        manifest = python_pod(
            name, SERVER, labels={"app": app}, env=[field_env("POD_IP", "status.podIP")]
        )
        if hostname == "web-0":  # a stable name: <hostname>.<service>
            manifest["spec"].update(hostname="web-0", subdomain=svc)
        core.create_namespaced_pod(ns, manifest)
    ips = {h: wait_running(core, ns, n).status.pod_ip for h, n in servers.items()}
    block = ipaddress.ip_network(cluster.pod_cidr)
    assert len(set(ips.values())) == 2
    assert all(ipaddress.ip_address(ip) in block for ip in ips.values()), ips

    # The kubelet marks the pods Ready; the endpointslice controller lists them.
    wait_for(
        "both servers in the EndpointSlice",
        lambda: _ready_endpoints(cluster, svc) == sorted(ips.values()),
        timeout=30,
    )
    # From the node, as from any pod: each server answers on its own IP only.
    for ip in ips.values():
        reply = wait_for(f"{ip}:{PORT}", lambda ip=ip: _fetch(ip), timeout=30)
        assert reply["server"] == ip
    with socket.socket() as sock:
        sock.settimeout(2)
        assert sock.connect_ex(("127.0.0.1", PORT)) != 0  # not on the host's address

    client_name = _name("client")
    env = [
        {"name": "SVC", "value": svc},
        {"name": "EXPECT", "value": "2"},
        field_env("POD_NAMESPACE", "metadata.namespace"),
    ]
    core.create_namespaced_pod(ns, python_pod(client_name, CLIENT, env=env))
    pod = wait_terminal(core, ns, client_name, timeout=120)
    log = container_log(cluster.workdir, pod)
    assert pod.status.phase == "Succeeded", log
    out = last_json_line(log)

    assert f"nameserver {cluster.dns_address}" in out["resolv"]
    assert f"search {ns}.svc.cluster.local svc.cluster.local cluster.local" in out["resolv"]
    assert out["hostname"] == client_name
    assert out["self"] == pod.status.pod_ip
    assert pod.status.pod_ip not in ips.values()
    for name, found in out["resolved"].items():
        want = [ips["web-0"]] if name.startswith("web-0.") else sorted(ips.values())
        assert found == want, (name, found)
    assert sorted(r["server"] for r in out["replies"]) == sorted(ips.values())
    assert out["by_hostname"] == {"server": ips["web-0"], "hostname": "web-0"}
    assert "unexpected" not in out
    assert out["nxdomain_seconds"] < 2, out["nxdomain_seconds"]

    # A pod that goes away leaves the Service's records.
    core.delete_namespaced_pod(servers["web-1"], ns, grace_period_seconds=0)
    fqdn = f"{svc}.{ns}.svc.cluster.local"
    wait_for(
        "DNS to drop the deleted pod",
        lambda: dns_query(cluster.dns_address, fqdn) == (0, [ips["web-0"]]),
        timeout=30,
    )
    assert dns_query(cluster.dns_address, fqdn, tcp=True) == (0, [ips["web-0"]])
    core.delete_namespaced_service(svc, ns)


def _fetch(ip: str) -> dict | None:
    try:
        with socket.create_connection((ip, PORT), timeout=2) as conn:
            return json.loads(conn.makefile().read())
    except OSError:
        return None


def test_dns_answers_nxdomain_for_unknown_names_at_once(cluster) -> None:
    for name in ("nothing.elastic-step-test.svc.cluster.local", "example.com", "localhost"):
        started = time.monotonic()
        assert dns_query(cluster.dns_address, name) == (3, [])
        assert time.monotonic() - started < 1
    # The apiserver has a name too, as kubernetes.default.svc does in any cluster.
    assert dns_query(cluster.dns_address, "kubernetes.default.svc.cluster.local") == (
        0,
        ["127.0.0.1"],
    )
    # An existing name has no AAAA record: an empty answer, not NXDOMAIN.
    assert dns_query(cluster.dns_address, "kubernetes.default.svc.cluster.local", qtype=28) == (
        0,
        [],
    )
