"""A PS's memory under large calls without credentials, against the same calls with them.

Each case starts a PS process built as ``elastic-step ps`` builds its server (the real
servicer, the authentication interceptor, the PS's message limit, 8 threads), with no shard:
an authenticated Push is parsed and then answered UNAVAILABLE, an unauthenticated one is
refused before it is parsed. Eight 64 MiB pushes are sent one after another, and the PS's
resident memory (VmRSS) and its peak (VmHWM) are read from /proc before and after.

    .venv/bin/python bench/preauth_rss.py [--calls 8] [--mib 64]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import grpc

from elastic_step.rpc import auth, ps_pb2
from elastic_step.rpc.ps_client import CHANNEL_OPTIONS

SECRET = "b" * 64
PS_SERVICE = "elastic_step.ParameterServer"
SERVER = f"""
import sys, threading
from concurrent import futures
import grpc
from elastic_step.ps.server import ParameterServerServicer
from elastic_step.rpc import auth, ps_pb2_grpc
from elastic_step.rpc.tokens import TokenSigner
from elastic_step.rpc.ps_client import CHANNEL_OPTIONS
server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=CHANNEL_OPTIONS,
                     interceptors=[auth.AuthInterceptor(TokenSigner({SECRET!r}).verify_key)])
ps_pb2_grpc.add_ParameterServerServicer_to_server(ParameterServerServicer(), server)
print(server.add_insecure_port("127.0.0.1:0"), flush=True)
server.start()
sys.stdin.read()  # until the bench closes it
"""


def memory_mib(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def run_case(authenticated: bool, calls: int, mib: int) -> dict[str, float]:
    ps = subprocess.Popen(
        [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(ps.stdout.readline())
        address = f"127.0.0.1:{port}"
        time.sleep(1.0)  # settled after start
        before = memory_mib(ps.pid)
        big = ps_pb2.PushRequest()
        big.dense.add(name="w", dtype="float32", shape=[mib << 18], content=bytes(mib << 20))
        payload = big.SerializeToString()
        if authenticated:
            credentials = auth.Credentials.for_instance(SECRET, "worker-0")
            channel = auth.authenticated_channel(
                address, credentials, server_role="ps", options=CHANNEL_OPTIONS
            )
        else:
            channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        expected = grpc.StatusCode.UNAVAILABLE if authenticated else grpc.StatusCode.UNAUTHENTICATED
        with channel:
            push = channel.unary_unary(f"/{PS_SERVICE}/Push")
            for _ in range(calls):
                try:
                    push(payload, timeout=60)
                except grpc.RpcError as e:
                    assert e.code() == expected, e
        time.sleep(0.5)
        after = memory_mib(ps.pid)
        return {
            "rss_before": before["VmRSS"],
            "rss_after": after["VmRSS"],
            "peak_growth": after["VmHWM"] - before["VmHWM"],
        }
    finally:
        ps.stdin.close()
        ps.kill()
        ps.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    rows = {}
    for name, authenticated in (("without credentials", False), ("with credentials", True)):
        rows[name] = run_case(authenticated, args.calls, args.mib)
        r = rows[name]
        print(
            f"{args.calls} x {args.mib} MiB pushes {name}: PS RSS {r['rss_before']:.0f} -> "
            f"{r['rss_after']:.0f} MiB, peak +{r['peak_growth']:.0f} MiB",
            flush=True,
        )
    refused, parsed = rows["without credentials"], rows["with credentials"]
    print(
        f"peak growth, refused / parsed: {refused['peak_growth']:.0f} / "
        f"{parsed['peak_growth']:.0f} MiB = {refused['peak_growth'] / parsed['peak_growth']:.2f}"
    )


if __name__ == "__main__":
    main()
