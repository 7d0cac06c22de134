"""Shared by every test directory: the contracts that more than one implementation passes,
and a real S3-compatible server."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "contracts"))


#: What could point botocore elsewhere than the test server.
_AWS_VARIABLES = (
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_ENDPOINT_URL_S3",
)


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on 127.0.0.1 that checks credentials (see s3_server.py)."""
    from s3_server import S3Server

    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch, tmp_path):
    """This process's environment (and so its children's) points at ``s3_server``, and
    ``s3://`` and ``minio://`` storages are built afresh from it."""
    from elastic_step.data import storage

    for name in _AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(storage, "_INSTANCES", {})
    return s3_server
