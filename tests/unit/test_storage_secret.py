"""--storage-secret: the object store's credentials reach every worker and PS pod through
secretKeyRef env, from a Secret of AWS variables or from KFP's mlpipeline-minio-artifact."""

from __future__ import annotations

import pytest

from elastic_step.backends.api import LaunchSpec, Role
from elastic_step.backends.kubernetes_options import KubernetesOptions
from elastic_step.backends.kubernetes_pods import build_pod
from elastic_step.cli import build_parser, main
from elastic_step.errors import InputError
from elastic_step.kubernetes_flags import kubernetes_flags_given, options_from_args

BASE = ["train", "--model-def", "m.py", "--data", "s3://b/d", "--output", "s3://b/o"]


def options(*flags: str) -> KubernetesOptions:
    return options_from_args(build_parser().parse_args([*BASE, "--backend", "kubernetes", *flags]))


def pod_env(options: KubernetesOptions, role: Role = Role.WORKER) -> dict[str, dict]:
    spec = LaunchSpec(f"{role.value}-0", role, 0, ["python", "-m", "elastic_step", role.value])
    pod = build_pod(spec, options, job_name="job-1", namespace="ml", image="reg/es:1", owner=None)
    [main_container] = pod["spec"]["containers"]
    return {e["name"]: e.get("valueFrom") or {"value": e["value"]} for e in main_container["env"]}


def ref(secret: str, key: str, optional: bool = False) -> dict:
    return {
        "secretKeyRef": {"name": secret, "key": key, **({"optional": True} if optional else {})}
    }


@pytest.mark.parametrize("role", [Role.WORKER, Role.PS])
def test_kfp_minio_secret_is_read_by_its_own_keys(role):
    env = pod_env(options("--storage-secret", "mlpipeline-minio-artifact"), role)
    assert env["AWS_ACCESS_KEY_ID"] == ref("mlpipeline-minio-artifact", "accesskey")
    assert env["AWS_SECRET_ACCESS_KEY"] == ref("mlpipeline-minio-artifact", "secretkey")
    assert "AWS_ENDPOINT_URL" not in env  # minio:// defaults to KFP's MinIO Service


def test_an_aws_secret_maps_its_keys_and_env_overrides_the_optional_ones():
    env = pod_env(options("--storage-secret", "s3-creds", "--env", "AWS_REGION=eu-west-1"))
    assert env["AWS_ACCESS_KEY_ID"] == ref("s3-creds", "AWS_ACCESS_KEY_ID")
    assert env["AWS_SECRET_ACCESS_KEY"] == ref("s3-creds", "AWS_SECRET_ACCESS_KEY")
    assert env["AWS_SESSION_TOKEN"] == ref("s3-creds", "AWS_SESSION_TOKEN", optional=True)
    assert env["AWS_ENDPOINT_URL"] == ref("s3-creds", "AWS_ENDPOINT_URL", optional=True)
    assert env["AWS_REGION"] == {"value": "eu-west-1"}
    assert not {"AWS_ACCESS_KEY_ID", "AWS_ENDPOINT_URL"} & pod_env(KubernetesOptions()).keys()


def test_a_bad_secret_name_is_refused():
    with pytest.raises(InputError) as e:
        options("--storage-secret", "S3_Creds")
    assert str(e.value) == "--storage-secret must be a Secret's name (DNS-1123), got 'S3_Creds'"


def test_storage_secret_needs_the_kubernetes_backend(capsys):
    args = build_parser().parse_args([*BASE, "--storage-secret", "s3-creds"])
    assert kubernetes_flags_given(args) == ["--storage-secret"]
    assert main([*BASE, "--storage-secret", "s3-creds"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "elastic-step: error: --storage-secret applies to --backend kubernetes only"
    ]
