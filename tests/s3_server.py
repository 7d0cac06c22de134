"""A real S3-compatible server for tests: moto's, on 127.0.0.1, checking credentials.

moto accepts any credentials until it is told to check them; this server is told to once its
one IAM user exists, so that a wrong key id or secret is refused as AWS would refuse it.
"""

from __future__ import annotations

import json
import logging
import uuid

import boto3
import requests
from moto import settings as moto_settings
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
_ALLOW_S3 = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}


class S3Server:
    def __init__(self) -> None:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request
        # Buckets are named in the path only, as by the stores it stands in for (MinIO,
        # SeaweedFS): moto would read "seaweedfs" in a Host of seaweedfs.kubeflow:9000 as one.
        moto_settings.S3_IGNORE_SUBDOMAIN_BUCKETNAME = True
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        iam.create_user(UserName="elastic-step")
        iam.put_user_policy(
            UserName="elastic-step", PolicyName="s3", PolicyDocument=json.dumps(_ALLOW_S3)
        )
        key = iam.create_access_key(UserName="elastic-step")["AccessKey"]
        self.access_key_id = key["AccessKeyId"]
        self.secret_access_key = key["SecretAccessKey"]
        # From now on every request must be signed by the user's key.
        response = requests.post(f"{self.endpoint}/moto-api/reset-auth", data=b"0", timeout=10)
        response.raise_for_status()
        self._s3 = boto3.client("s3", **self.client_kwargs())
        self._also: list[ThreadedMotoServer] = []

    def client_kwargs(self) -> dict[str, str]:
        return {
            "endpoint_url": self.endpoint,
            "region_name": REGION,
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
        }

    def env(self) -> dict[str, str]:
        """The environment in which elastic-step reaches this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": REGION,
        }

    def new_bucket(self) -> str:
        name = f"test-{uuid.uuid4().hex[:12]}"
        self._s3.create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every object key under ``prefix``, read with boto3 itself."""
        pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def read(self, bucket: str, key: str) -> bytes:
        """One object's bytes, read with boto3 itself."""
        return self._s3.get_object(Bucket=bucket, Key=key)["Body"].read()

    def serve_also(self, host: str, port: int) -> str:
        """The same store at another address too (moto keeps its state per process, so both
        servers answer from it): for clients that dial a fixed address, such as KFP's
        default object store. Its endpoint URL."""
        server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
        server.start()
        self._also.append(server)
        return f"http://{host}:{port}"

    def stop(self) -> None:
        for server in self._also:
            server.stop()
        self._server.stop()
