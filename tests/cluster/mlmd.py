"""ML Metadata (MLMD) for the KFP tests: the gRPC service ``ml_metadata.MetadataStoreService``
that KFP's v2 driver and launcher record runs in, and the gRPC-web endpoint that KFP's UI
reads them from.

No C++ MLMD server is packaged. :func:`build_mlmd` builds a venv with the ml-metadata wheel
(MLMD's store as a library) from pinned requirements (``build_mlmd.sh``, cached), and
:func:`start_mlmd` runs ``mlmd_server.py`` in it as a host process: the store in a sqlite
file in the work directory, gRPC and gRPC-web on the ports given. The test side's venv needs
no ml_metadata: it only starts the process and waits for both ports.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests
from local_cluster import (
    CLUSTER_DIR,
    ClusterStartError,
    die_with_parent,
    log_tail,
    run_build,
    stop_process,
    wait_for,
)

SERVICE = "ml_metadata.MetadataStoreService"
#: The port KFP's driver and launcher dial (v2/metadata/env.go).
MLMD_PORT = 8080


def build_mlmd() -> Path:
    """The venv that runs mlmd_server.py (built once, then cached)."""
    return run_build("build_mlmd.sh", "ML Metadata")


@dataclass(frozen=True)
class Mlmd:
    grpc_address: str  # HOST:PORT, what KFP's driver and launcher dial
    web_url: str  # http://HOST:PORT, gRPC-web for KFP's UI (its METADATA_ENVOY_SERVICE)
    log: Path
    venv: Path

    def artifacts_of_run(self, run_id: str) -> list[dict]:
        """Every artifact a task of KFP run ``run_id`` produced, read with MLMD's own client
        (mlmd_query.py): type, uri, name, task, execution_id and metadata."""
        result = subprocess.run(
            [str(self.venv / "bin" / "python"), str(CLUSTER_DIR / "mlmd_query.py"),
             self.grpc_address, run_id],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return json.loads(result.stdout)


@contextlib.contextmanager
def start_mlmd(
    venv: Path, workdir: Path, *, host: str, web_port: int, grpc_port: int = MLMD_PORT
) -> Iterator[Mlmd]:
    """MLMD's server with its store in ``workdir`` (see the module); stopped on exit."""
    log_path = workdir / "mlmd.log"
    mlmd = Mlmd(f"{host}:{grpc_port}", f"http://{host}:{web_port}", log_path, venv)
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [str(venv / "bin" / "python"), str(CLUSTER_DIR / "mlmd_server.py"),
             f"--db={workdir / 'mlmd' / 'metadata.sqlite'}", f"--grpc={mlmd.grpc_address}",
             f"--grpc-web={host}:{web_port}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent,
        )  # fmt: skip
    try:

        def up() -> bool:
            if server.poll() is not None:
                raise ClusterStartError(f"MLMD's server exited:\n{log_tail(log_path)}")
            return _grpc_listening(host, grpc_port) and _web_answers(mlmd.web_url)

        wait_for("MLMD's server", up, timeout=60, interval=0.3)
        yield mlmd
    finally:
        stop_process(server, timeout=15)


def _grpc_listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def _web_answers(web_url: str) -> bool:
    """A real call (GetArtifactTypes, an empty request) that answers grpc-status 0."""
    try:
        reply = requests.post(
            f"{web_url}/{SERVICE}/GetArtifactTypes",
            data=struct.pack(">BI", 0, 0),  # one data frame holding the empty message
            headers={"Content-Type": "application/grpc-web+proto"},
            timeout=5,
        )
    except requests.RequestException:
        return False
    return reply.ok and b"grpc-status:0\r\n" in reply.content
