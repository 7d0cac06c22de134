"""Session fixtures: the test control plane with Argo's own workflow-controller (see
tests/cluster/argo.py), an S3 server on loopback as the artifact repository and the
workflows' object store, and the example's data in it; and Kubeflow Pipelines' backend,
which runs its pipelines on that controller: its API server, persistence agent and ML
Metadata, with the driver and launcher on the pods' PATH (tests/cluster/kfp_backend.py,
mlmd.py). `make test-argo` runs these tests.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from argo import Argo, build_argo, start_argo
from example_data import write_breast_cancer_csv
from host_services import service_address
from kfp_backend import (
    KFP_BUCKET,
    OBJECT_STORE_ADDRESS,
    OBJECT_STORE_PORT,
    Kfp,
    build_kfp,
    start_kfp,
)
from kfp_helpers import upload_example_inputs
from kfp_ui import Ui, build_kfp_ui, start_ui
from kubernetes import client
from local_cluster import ClusterStartError, build_binary, start_cluster
from mlmd import build_mlmd

#: The example workflow's default work-dir is s3://elastic-step/runs: the same bucket also
#: serves as Argo's artifact repository (its csv input is datasets/breast_cancer.csv there).
BUCKET = "elastic-step"
STORAGE_SECRET = "elastic-step-storage"
_BUILT: dict[str, Path] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    # Cold builds take minutes; doing them here keeps them out of any test's timeout.
    try:
        _BUILT["cluster"] = build_binary()
        _BUILT["argo"] = build_argo()
        _BUILT["kfp"] = build_kfp()
        _BUILT["mlmd"] = build_mlmd()
        _BUILT["kfp-ui"] = build_kfp_ui()
    except ClusterStartError as err:
        pytest.exit(str(err), 1)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test-argo` runs two workers (pytest-xdist), each with its own control plane:
    the tests of Kubeflow Pipelines (files test_kfp_*.py) all on one, since KFP's API
    server binds ports it hard-codes, and Argo's own tests on the other."""
    from xdist.scheduler import LoadScopeScheduling

    class KfpApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "kfp" if Path(nodeid.split("::")[0]).name.startswith("test_kfp") else "argo"

    return KfpApart(config, log)


@pytest.fixture(scope="session")
def argo(tmp_path_factory: pytest.TempPathFactory, s3_server) -> Iterator[Argo]:
    started = time.monotonic()
    s3 = boto3.client("s3", **s3_server.client_kwargs())
    s3.create_bucket(Bucket=BUCKET)
    csv = tmp_path_factory.mktemp("data") / "breast_cancer.csv"
    write_breast_cancer_csv(csv)
    s3.upload_file(str(csv), BUCKET, "datasets/breast_cancer.csv")
    env = s3_server.env()
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(
            start_cluster(
                tmp_path_factory.mktemp("argo"),
                _BUILT["cluster"],
                # argoexec, and KFP's driver and launcher-v2, as their images have them.
                pod_path=[_BUILT["argo"], _BUILT["kfp"]],
            )  # no host path under /tmp: the steps exchange their files through S3 only
        )
        with cluster.admin() as api:
            # What the example's steps read the object store with (podSpecPatch, pod template).
            client.CoreV1Api(api).create_namespaced_secret(
                cluster.namespace,
                {"metadata": {"name": STORAGE_SECRET}, "stringData": env},
            )
        argo = stack.enter_context(start_argo(cluster, _BUILT["argo"], s3_env=env, bucket=BUCKET))
        print(f"\ncontrol plane and Argo's controller ready in {time.monotonic() - started:.1f}s")
        yield argo


@pytest.fixture(scope="session")
def kfp(argo: Argo, s3_server, tmp_path_factory) -> Iterator[Kfp]:
    """Kubeflow Pipelines' backend over Argo's controller (tests/cluster/kfp_backend.py), and
    the example's inputs in its bucket (tests/argo/kfp_helpers.py)."""
    boto3.client("s3", **s3_server.client_kwargs()).create_bucket(Bucket=KFP_BUCKET)
    work = tmp_path_factory.mktemp("kfp")
    write_breast_cancer_csv(work / "breast_cancer.csv")
    upload_example_inputs(s3_server.client_kwargs(), work / "breast_cancer.csv")
    address = service_address(argo.cluster.pod_cidr, OBJECT_STORE_ADDRESS)
    store = s3_server.serve_also(address, OBJECT_STORE_PORT).removeprefix("http://")
    with start_kfp(
        argo.cluster, _BUILT["kfp"], _BUILT["mlmd"], work, s3_env=s3_server.env(),
        object_store=store,
    ) as backend:  # fmt: skip
        yield backend


@pytest.fixture(scope="session")
def kfp_ui(argo: Argo, kfp: Kfp) -> Iterator[Ui]:
    """KFP's UI as KFP deploys it, a pod beside the backend (tests/cluster/kfp_ui.py)."""
    with start_ui(argo.cluster, _BUILT["kfp-ui"]) as ui:
        yield ui


@pytest.fixture(scope="session")
def training_data(argo: Argo, s3_server, tmp_path_factory) -> str:
    """The example's data preprocessed once into the bucket, for the tests that run the
    training step alone: its URI."""
    csv = tmp_path_factory.mktemp("prep") / "breast_cancer.csv"
    write_breast_cancer_csv(csv)
    uri = f"s3://{BUCKET}/fixtures/data"
    subprocess.run(
        [sys.executable, "-m", "elastic_step", "preprocess", "--input", str(csv),
         "--label", "benign", "--output", uri, "--shards", "4"],
        env={**_clean_env(), **s3_server.env()},
        check=True,
        capture_output=True,
    )  # fmt: skip
    return uri


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
