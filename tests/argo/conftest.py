"""Session fixtures: the test control plane with Argo's own workflow-controller (see
tests/cluster/argo.py), an S3 server on loopback as the artifact repository and the
workflows' object store, and the example's data in it; and Kubeflow Pipelines' API server,
which runs its pipelines on that controller (tests/cluster/kfp_backend.py). `make test-argo` runs
these tests.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from argo import Argo, build_argo, start_argo
from example_data import write_breast_cancer_csv
from kfp_backend import ApiServer, build_kfp, start_api_server, start_mariadb
from kubernetes import client
from local_cluster import ClusterStartError, build_binary, start_cluster

#: The example workflow's default work-dir is s3://elastic-step/runs: the same bucket also
#: serves as Argo's artifact repository (its csv input is datasets/breast_cancer.csv there).
BUCKET = "elastic-step"
STORAGE_SECRET = "elastic-step-storage"
#: KFP's own bucket, as in a default install.
KFP_BUCKET = "mlpipeline"
_BUILT: dict[str, Path] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    # Cold builds take minutes; doing them here keeps them out of any test's timeout.
    try:
        _BUILT["cluster"] = build_binary()
        _BUILT["argo"] = build_argo()
        _BUILT["kfp"] = build_kfp()
    except ClusterStartError as err:
        pytest.exit(str(err), 1)


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
                tmp_path_factory.mktemp("argo"), _BUILT["cluster"], pod_path=[_BUILT["argo"]]
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
def kfp_api(argo: Argo, s3_server, tmp_path_factory) -> Iterator[ApiServer]:
    """KFP's API server over Argo's controller, with MariaDB (tests/cluster/kfp_backend.py), its
    pipelines in the bucket ``mlpipeline``."""
    boto3.client("s3", **s3_server.client_kwargs()).create_bucket(Bucket=KFP_BUCKET)
    work = tmp_path_factory.mktemp("kfp")
    with start_mariadb(work) as database:
        env = s3_server.env()
        with start_api_server(
            argo.cluster, _BUILT["kfp"], database, s3_env=env, bucket=KFP_BUCKET
        ) as server:
            yield server


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
