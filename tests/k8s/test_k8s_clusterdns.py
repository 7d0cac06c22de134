"""The cluster DNS server's records and wire format, without a cluster."""

from __future__ import annotations

import socket
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from clusterdns import DNSServer, Records, answer

SLICE = {
    "metadata": {
        "namespace": "ns",
        "name": "ps-abcde",
        "labels": {"kubernetes.io/service-name": "ps"},
    },
    "addressType": "IPv4",
    "endpoints": [
        {"addresses": ["127.1.0.7"], "conditions": {"ready": True}, "hostname": "ps-0"},
        {"addresses": ["127.1.0.3"], "conditions": {"ready": True}},
        {"addresses": ["127.1.0.9"], "conditions": {"ready": False}},
        {"addresses": ["127.1.0.4"]},  # ready unset counts as ready
    ],
}


def _query(name: str, qtype: int = 1, ident: int = 7) -> bytes:
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", qtype, 1)


def _decode(reply: bytes) -> tuple[int, int, list[str]]:
    ident, flags, _, an = struct.unpack_from("!HHHH", reply)
    offset = 12
    while reply[offset]:
        offset += reply[offset] + 1
    offset += 5
    out = []
    for _ in range(an):
        rdlength = struct.unpack_from("!HHHIH", reply, offset)[4]
        offset += 12
        out.append(socket.inet_ntoa(reply[offset : offset + rdlength]))
        offset += rdlength
    return ident, flags, out


def test_records_follow_ready_endpoints() -> None:
    records = Records(static={"kubernetes.default.svc.cluster.local": ["127.0.0.1"]})
    records.replace([SLICE])
    assert records.lookup("ps.ns.svc.cluster.local") == (
        True,
        ["127.1.0.3", "127.1.0.4", "127.1.0.7"],
    )
    assert records.lookup("PS-0.ps.ns.svc.cluster.local.") == (True, ["127.1.0.7"])
    assert records.lookup("127-1-0-9.ns.pod.cluster.local") == (True, ["127.1.0.9"])
    assert records.lookup("kubernetes.default.svc.cluster.local") == (True, ["127.0.0.1"])
    assert records.lookup("ps.other.svc.cluster.local") == (False, [])
    assert records.lookup("ps.ns.svc") == (False, [])  # short names work via the search path
    records.apply("DELETED", SLICE)
    assert records.lookup("ps.ns.svc.cluster.local") == (False, [])


def test_wire_answers() -> None:
    records = Records()
    records.replace([SLICE])
    ident, flags, addresses = _decode(answer(records, _query("ps.ns.svc.cluster.local")))
    assert (ident, flags & 0x8000, flags & 0xF) == (7, 0x8000, 0)
    assert addresses == ["127.1.0.3", "127.1.0.4", "127.1.0.7"]
    _, flags, addresses = _decode(answer(records, _query("ps.ns.svc.cluster.local", qtype=28)))
    assert (flags & 0xF, addresses) == (0, [])  # exists, but no AAAA
    _, flags, addresses = _decode(answer(records, _query("example.com")))
    assert (flags & 0xF, addresses) == (3, [])  # NXDOMAIN, no upstream
    assert answer(records, b"\x00\x01garbage")[3] & 0xF == 1  # FORMERR


def test_large_answers_are_truncated_over_udp_and_whole_over_tcp() -> None:
    big = dict(SLICE, endpoints=[{"addresses": [f"127.1.1.{i}"]} for i in range(1, 60)])
    records = Records()
    records.replace([big])
    udp = answer(records, _query("ps.ns.svc.cluster.local"), udp=True)
    assert struct.unpack_from("!H", udp, 2)[0] & 0x0200  # TC: retry over TCP
    tcp = answer(records, _query("ps.ns.svc.cluster.local"), udp=False)
    assert len(_decode(tcp)[2]) == 59


def test_server_over_udp_and_tcp() -> None:
    records = Records()
    records.replace([SLICE])
    server = DNSServer(records, "127.0.0.1", 0)
    server.start()
    try:
        host, port = server.address
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(5)
            sock.sendto(_query("ps-0.ps.ns.svc.cluster.local"), (host, port))
            assert _decode(sock.recv(4096))[2] == ["127.1.0.7"]
        with socket.create_connection((host, port), timeout=5) as sock:
            for ident in (1, 2):  # two queries on one connection
                query = _query("ps-0.ps.ns.svc.cluster.local", ident=ident)
                sock.sendall(struct.pack("!H", len(query)) + query)
                stream = sock.makefile("rb")
                reply = stream.read(struct.unpack("!H", stream.read(2))[0])
                assert _decode(reply)[:1] == (ident,)
    finally:
        server.stop()
