"""Cluster DNS for the test cluster: Services and pods by name, from EndpointSlices.

A small authoritative server for the cluster domain (cluster.local), on UDP and TCP port 53
of one loopback address. It answers A queries for

- <service>.<namespace>.svc.<domain>: the addresses of the Service's ready endpoints
  (headless or not: there is no kube-proxy, so no virtual IP to hand out);
- <hostname>.<service>.<namespace>.svc.<domain>: the endpoint with that hostname (a pod
  with spec.hostname and spec.subdomain=<service>);
- <a-b-c-d>.<namespace>.pod.<domain>: a-b-c-d read as an address ("pods insecure");
- static names given at start (kubernetes.default.svc.<domain> -> the apiserver).

A name that exists but has no record of the asked type gets an empty NOERROR answer;
anything else, inside or outside the domain, NXDOMAIN at once: there is no upstream, so
test pods cannot reach the outside world by name. The short forms (<svc>, <svc>.<ns>,
<svc>.<ns>.svc) work through the search path the kubelet writes into resolv.conf.

The records follow EndpointSlices (discovery.k8s.io/v1) by list and watch: an endpoint
counts when conditions.ready is true or unset, as in CoreDNS.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("cluster-dns")

TYPE_A, TYPE_NS, TYPE_CNAME, TYPE_SOA, TYPE_AAAA, TYPE_ANY = 1, 2, 5, 6, 28, 255
CLASS_IN = 1
NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP = 0, 1, 2, 3, 4
TTL = 5  # short: tests create and delete endpoints all the time
UDP_LIMIT = 512


class Records:
    """Name -> addresses, from EndpointSlices. Thread-safe."""

    def __init__(self, domain: str = "cluster.local", static: dict[str, list[str]] | None = None):
        self.domain = domain.strip(".").lower()
        self.static = {k.strip(".").lower(): v for k, v in (static or {}).items()}
        self.lock = threading.Lock()
        # (namespace, slice name) -> (service, [(address, hostname), ...]) of ready endpoints
        self.slices: dict[tuple[str, str], tuple[str, list[tuple[str, str]]]] = {}

    @staticmethod
    def _ready(endpoint: dict[str, Any]) -> bool:
        ready = (endpoint.get("conditions") or {}).get("ready")
        return ready is None or ready is True

    def _entry(self, eps: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
        service = (eps.get("metadata", {}).get("labels") or {}).get(
            "kubernetes.io/service-name", ""
        )
        ready = []
        if eps.get("addressType", "IPv4") == "IPv4":
            for endpoint in eps.get("endpoints") or []:
                if self._ready(endpoint):
                    host = endpoint.get("hostname") or ""
                    ready += [(a, host) for a in endpoint.get("addresses") or []]
        return service, ready

    def replace(self, slices: Iterable[dict[str, Any]]) -> None:
        table = {}
        for eps in slices:
            meta = eps["metadata"]
            table[(meta["namespace"], meta["name"])] = self._entry(eps)
        with self.lock:
            self.slices = table

    def apply(self, kind: str, eps: dict[str, Any]) -> None:
        meta = eps["metadata"]
        key = (meta["namespace"], meta["name"])
        with self.lock:
            if kind == "DELETED":
                self.slices.pop(key, None)
            else:
                self.slices[key] = self._entry(eps)

    def _service(self, namespace: str, service: str) -> list[tuple[str, str]]:
        with self.lock:
            out = []
            for (ns, _), (svc, endpoints) in self.slices.items():
                if ns == namespace and svc == service:
                    out += endpoints
        return out

    def lookup(self, name: str) -> tuple[bool, list[str]]:
        """(name exists, IPv4 addresses) for a fully qualified name."""
        name = name.strip(".").lower()
        if name in self.static:
            return True, list(self.static[name])
        suffix = "." + self.domain
        if not name.endswith(suffix):
            return False, []
        labels = name[: -len(suffix)].split(".")
        addresses: list[str] = []
        if len(labels) == 4 and labels[3] == "svc":
            host, service, namespace = labels[0], labels[1], labels[2]
            addresses = [a for a, h in self._service(namespace, service) if h == host]
        elif len(labels) == 3 and labels[2] == "svc":
            addresses = [a for a, _ in self._service(labels[1], labels[0])]
        elif len(labels) == 3 and labels[2] == "pod":
            try:
                addresses = [str(ipaddress.IPv4Address(labels[0].replace("-", ".")))]
            except ValueError:
                addresses = []
        unique = sorted(set(addresses), key=lambda a: ipaddress.IPv4Address(a))
        return bool(unique), unique


# --- wire format -------------------------------------------------------------------------


def _encode_name(name: str) -> bytes:
    out = b""
    for label in name.strip(".").split("."):
        if label:
            out += bytes([len(label)]) + label.encode()
    return out + b"\x00"


def _read_name(data: bytes, offset: int) -> tuple[str, int]:
    labels = []
    jumps = 0
    end = None
    while True:
        if offset >= len(data):
            raise ValueError("name runs past the message")
        length = data[offset]
        if length & 0xC0 == 0xC0:
            if jumps > 16:
                raise ValueError("compression loop")
            pointer = struct.unpack_from("!H", data, offset)[0] & 0x3FFF
            end = offset + 2 if end is None else end
            offset, jumps = pointer, jumps + 1
            continue
        offset += 1
        if length == 0:
            break
        labels.append(data[offset : offset + length].decode("ascii", "replace"))
        offset += length
    return ".".join(labels), end if end is not None else offset


def parse_query(data: bytes) -> tuple[int, int, str, int, int, bytes]:
    """(id, flags, name, qtype, qclass, raw question) of a one-question query."""
    if len(data) < 12:
        raise ValueError("short message")
    ident, flags, qdcount = struct.unpack_from("!HHH", data, 0)
    if qdcount != 1:
        raise ValueError(f"{qdcount} questions")
    name, offset = _read_name(data, 12)
    qtype, qclass = struct.unpack_from("!HH", data, offset)
    return ident, flags, name, qtype, qclass, data[12 : offset + 4]


def _soa(domain: str) -> bytes:
    rdata = (
        _encode_name(f"ns.dns.{domain}")
        + _encode_name(f"hostmaster.{domain}")
        + struct.pack("!IIIII", int(time.time()) & 0xFFFFFFFF, 7200, 1800, 86400, TTL)
    )
    return _encode_name(domain) + struct.pack("!HHIH", TYPE_SOA, CLASS_IN, TTL, len(rdata)) + rdata


def answer(records: Records, query: bytes, udp: bool = True) -> bytes | None:
    """The response to one query message, or None if it cannot be parsed at all."""
    try:
        ident, flags, name, qtype, qclass, question = parse_query(query)
    except (ValueError, struct.error, IndexError):
        if len(query) < 2:
            return None
        ident = struct.unpack_from("!H", query, 0)[0]
        return struct.pack("!HHHHHH", ident, 0x8000 | FORMERR, 0, 0, 0, 0)
    opcode = (flags >> 11) & 0xF
    base = 0x8000 | (flags & 0x7800) | (flags & 0x0100)  # QR, opcode, RD copied
    if opcode != 0:
        return struct.pack("!HHHHHH", ident, base | NOTIMP, 1, 0, 0, 0) + question
    exists, addresses = records.lookup(name)
    fqdn = name.strip(".").lower()
    in_zone = fqdn == records.domain or fqdn.endswith("." + records.domain)
    answers = b""
    count = 0
    if exists and qclass in (CLASS_IN, TYPE_ANY) and qtype in (TYPE_A, TYPE_ANY):
        for address in addresses:
            answers += struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, TTL, 4)
            answers += ipaddress.IPv4Address(address).packed
            count += 1
    rcode = NOERROR if exists else NXDOMAIN
    flags_out = base | rcode | (0x0400 if in_zone or exists else 0)  # AA inside the zone
    authority = _soa(records.domain) if count == 0 else b""
    message = (
        struct.pack("!HHHHHH", ident, flags_out, 1, count, 1 if authority else 0, 0)
        + question
        + answers
        + authority
    )
    if udp and len(message) > UDP_LIMIT:  # the client retries over TCP
        message = struct.pack("!HHHHHH", ident, flags_out | 0x0200, 1, 0, 0, 0) + question
    return message


# --- servers -----------------------------------------------------------------------------


def _bind_pair(address: str, port: int) -> tuple[socket.socket, socket.socket | None]:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((address, port))
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        tcp.bind((address, udp.getsockname()[1]))
    except OSError:
        tcp.close()
        if port != 0:
            udp.close()
            raise
        return udp, None
    return udp, tcp


class DNSServer:
    """UDP and TCP on (address, port), answering from records until stop()."""

    def __init__(self, records: Records, address: str, port: int = 53):
        self.records = records
        # Port 0 picks a UDP port the kernel knows free for UDP only; the same number may
        # be taken for TCP, so try a bounded number of fresh picks.
        attempts = 20 if port == 0 else 1
        for attempt in range(attempts):
            self.udp, self.tcp = _bind_pair(address, port)
            if self.tcp is not None:
                break
            self.udp.close()
            if attempt == attempts - 1:
                raise OSError(f"no port on {address} free for both UDP and TCP (asked {port})")
        self.tcp.listen(64)
        self.address = self.udp.getsockname()
        self.stopping = threading.Event()
        self.queries = 0

    def start(self) -> None:
        for target, name in ((self._serve_udp, "dns-udp"), (self._serve_tcp, "dns-tcp")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def stop(self) -> None:
        self.stopping.set()
        for sock in (self.udp, self.tcp):
            with contextlib.suppress(OSError):
                sock.close()

    def _serve_udp(self) -> None:
        self.udp.settimeout(0.5)
        while not self.stopping.is_set():
            try:
                data, peer = self.udp.recvfrom(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.queries += 1
            reply = answer(self.records, data, udp=True)
            if reply:
                with contextlib.suppress(OSError):
                    self.udp.sendto(reply, peer)

    def _serve_tcp(self) -> None:
        self.tcp.settimeout(0.5)
        while not self.stopping.is_set():
            try:
                conn, _ = self.tcp.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._tcp_conn, args=(conn,), daemon=True).start()

    def _tcp_conn(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        with conn:
            try:
                while True:
                    head = _recv_exact(conn, 2)
                    if not head:
                        return
                    data = _recv_exact(conn, struct.unpack("!H", head)[0])
                    if data is None:
                        return
                    self.queries += 1
                    reply = answer(self.records, data, udp=False)
                    if reply is None:
                        return
                    conn.sendall(struct.pack("!H", len(reply)) + reply)
            except OSError:
                return


def _recv_exact(conn: socket.socket, size: int) -> bytes | None:
    buf = b""
    while len(buf) < size:
        chunk = conn.recv(size - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


# --- EndpointSlices ----------------------------------------------------------------------


def follow_endpoint_slices(api: Any, records: Records, stopping: threading.Event) -> None:
    """List and watch EndpointSlices in all namespaces into records until stopping is set."""
    from kubernetes import client, watch
    from kubernetes.client.rest import ApiException

    discovery = client.DiscoveryV1Api(api)
    while not stopping.is_set():
        try:
            resp = discovery.list_endpoint_slice_for_all_namespaces(_preload_content=False)
            data = json.loads(resp.data)
            records.replace(data["items"])
            version = data["metadata"]["resourceVersion"]
            stream = watch.Watch().stream(
                discovery.list_endpoint_slice_for_all_namespaces,
                resource_version=version,
                timeout_seconds=30,
                allow_watch_bookmarks=True,
            )
            for event in stream:
                if stopping.is_set():
                    return
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    records.apply(event["type"], event["raw_object"])
        except ApiException as err:
            if err.status != 410:
                log.warning("EndpointSlice watch failed: %s", err)
                stopping.wait(1)
        except Exception:
            log.exception("EndpointSlice watch failed")
            stopping.wait(1)
