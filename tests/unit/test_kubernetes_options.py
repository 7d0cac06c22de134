"""The Kubernetes backend's options: flags parsed into typed options, each value validated
with an error that names the flag, the value and the rule (no cluster needed)."""

from __future__ import annotations

import pytest

from elastic_step.backends.kubernetes_options import (
    KubernetesOptions,
    RoleResources,
    Toleration,
    Volume,
    load_pod_template,
    parse_toleration,
    parse_volume,
    quantity_value,
)
from elastic_step.cli import build_parser
from elastic_step.errors import InputError
from elastic_step.kubernetes_flags import kubernetes_flags_given, options_from_args

BASE = ["train", "--model-def", "m.py", "--data", "d", "--output", "o"]


def parse(*flags: str):
    return build_parser().parse_args([*BASE, "--backend", "kubernetes", *flags])


def options(*flags: str) -> KubernetesOptions:
    return options_from_args(parse(*flags))


def test_every_flag_reaches_the_options(tmp_path) -> None:
    template = tmp_path / "pod.yaml"
    template.write_text("spec:\n  terminationGracePeriodSeconds: 60\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("{}")
    o = options(
        "--namespace", "ml", "--image", "reg/es:1", "--image-pull-policy", "Always",
        "--image-pull-secret", "a", "--image-pull-secret", "b", "--service-account", "runner",
        "--worker-cpu", "500m", "--worker-memory", "2Gi", "--worker-gpu", "1",
        "--ps-cpu", "2", "--ps-memory", "4Gi",
        "--node-selector", "pool=train", "--node-selector", "example.com/zone=a",
        "--toleration", "gpu:NoSchedule", "--toleration", "team=ml:NoExecute",
        "--worker-priority-class", "low", "--high-priority-class", "high",
        "--high-priority-fraction", "0.25",
        "--volume", "claim=data,mount=/data,readonly", "--volume", "claim=ckpt,mount=/c,subpath=j",
        "--env", "A=1", "--env", "B=x=y", "--pod-template", str(template),
        "--kubeconfig", str(kubeconfig),
    )  # fmt: skip
    assert o == KubernetesOptions(
        namespace="ml",
        image="reg/es:1",
        image_pull_policy="Always",
        image_pull_secrets=("a", "b"),
        service_account="runner",
        worker=RoleResources(cpu="500m", memory="2Gi", gpu=1),
        ps=RoleResources(cpu="2", memory="4Gi"),
        node_selector={"pool": "train", "example.com/zone": "a"},
        tolerations=(
            Toleration(key="gpu", effect="NoSchedule"),
            Toleration(key="team", value="ml", effect="NoExecute"),
        ),
        worker_priority_class="low",
        high_priority_class="high",
        high_priority_fraction=0.25,
        volumes=(
            Volume(claim="data", mount="/data", read_only=True),
            Volume(claim="ckpt", mount="/c", sub_path="j"),
        ),
        env={"A": "1", "B": "x=y"},
        pod_template={"metadata": {}, "spec": {"terminationGracePeriodSeconds": 60}},
        pod_template_path=str(template),
        kubeconfig=str(kubeconfig),
    )


def test_defaults() -> None:
    o = options()
    assert o == KubernetesOptions()
    assert kubernetes_flags_given(parse()) == []


def test_the_flags_given_are_listed() -> None:
    args = parse("--image", "x", "--env", "A=1", "--worker-gpu", "1")
    assert kubernetes_flags_given(args) == ["--image", "--worker-gpu", "--env"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--namespace", "Bad_NS"], "--namespace must be a DNS-1123 label, got 'Bad_NS'"),
        (["--image", "a b"], "--image must be a non-empty image reference"),
        (["--worker-cpu", "lots"], "--worker-cpu must be a positive Kubernetes quantity such as "
         "500m or 2, got 'lots'"),
        (["--ps-memory", "0"], "--ps-memory must be a positive Kubernetes quantity"),
        (["--ps-cpu", "0.0001"], "--ps-cpu must be at least 1m, got '0.0001'"),
        (["--worker-gpu", "-1"], "--worker-gpu must be >= 0, got '-1'"),
        (["--node-selector", "pool"], "--node-selector must be KEY=VALUE, got 'pool'"),
        (["--node-selector", "bad key=x"], "--node-selector must be KEY=VALUE with a valid label"),
        (["--toleration", "gpu"], "--toleration must be KEY[=VALUE]:EFFECT, got 'gpu'"),
        (["--toleration", "gpu:Sometimes"], "--toleration must be KEY[=VALUE]:EFFECT with EFFECT "
         "NoSchedule, PreferNoSchedule, NoExecute, got 'gpu:Sometimes'"),
        (["--worker-priority-class", "Low"], "--worker-priority-class must be a PriorityClass"),
        (["--high-priority-fraction", "0.5"], "--high-priority-fraction needs "
         "--high-priority-class to be set, got '0.5'"),
        (["--high-priority-class", "h", "--high-priority-fraction", "1.5"],
         "--high-priority-fraction must be between 0 and 1, got '1.5'"),
        (["--high-priority-class", "h", "--high-priority-fraction", "nan"],
         "--high-priority-fraction must be between 0 and 1"),
        (["--volume", "claim=data"], "--volume needs both claim=NAME and mount=/PATH, got "
         "'claim=data'"),
        (["--volume", "claim=data,mount=rel"], "--volume mount= must be an absolute path"),
        (["--volume", "claim=Data,mount=/d"], "--volume claim= must name a PersistentVolumeClaim"),
        (["--volume", "claim=a,mount=/d", "--volume", "claim=b,mount=/d"],
         "--volume mounts a path another --volume already mounts, got 'claim=b,mount=/d'"),
        (["--volume", "claim=a,mount=/d,subpath=../x"], "--volume subpath= must be a relative"),
        (["--volume", "claim=a,mount=/d,size=1"], "--volume must be claim=NAME,mount=/PATH"),
        (["--env", "NOVALUE"], "--env must be KEY=VALUE, got 'NOVALUE'"),
        (["--env", "1A=x"], "--env must be NAME=VALUE with a valid name, got '1A=x'"),
        (["--env", "ELASTIC_STEP_JOB_SECRET=x"], "--env sets a variable that elastic-step sets"),
        (["--image-pull-secret", "Bad"], "--image-pull-secret must be a Secret's name"),
        (["--service-account", "a b"], "--service-account must be a ServiceAccount's name"),
        (["--kubeconfig", "/no/such/file"], "--kubeconfig must be an existing file, got "
         "'/no/such/file'"),
        (["--pod-template", "/no/such/pod.yaml"], "--pod-template cannot read /no/such/pod.yaml"),
    ],
)  # fmt: skip
def test_each_bad_value_names_the_flag_the_value_and_the_rule(flags, message) -> None:
    with pytest.raises(InputError) as e:
        options(*flags)
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", 0.5), ("2", 2.0), ("1Gi", 2.0**30), ("1.5", 1.5), ("1e3", 1000.0), ("64Mi", 2.0**26),
     ("2x", None), ("", None), ("-1", None), ("1 Gi", None)],
)  # fmt: skip
def test_quantities(text, value) -> None:
    assert quantity_value(text) == value


def test_tolerations_and_volumes() -> None:
    assert parse_toleration("example.com/gpu=a100:NoSchedule").manifest() == {
        "key": "example.com/gpu",
        "operator": "Equal",
        "value": "a100",
        "effect": "NoSchedule",
    }
    assert parse_toleration("spot:NoExecute").manifest() == {
        "key": "spot",
        "operator": "Exists",
        "effect": "NoExecute",
    }
    assert parse_volume("readonly,mount=/m,claim=c") == Volume(
        claim="c", mount="/m", read_only=True
    )


@pytest.mark.parametrize(
    ("text", "template"),
    [
        (
            "apiVersion: v1\nkind: Pod\nmetadata:\n  labels: {a: b}\nspec:\n  hostname: x\n",
            {"metadata": {"labels": {"a": "b"}}, "spec": {"hostname": "x"}},
        ),
        (
            "metadata:\n  annotations: {x: 'y'}\nspec:\n  containers: [{name: main}]\n",
            {"metadata": {"annotations": {"x": "y"}}, "spec": {"containers": [{"name": "main"}]}},
        ),
        ("nodeSelector: {a: b}\n", {"metadata": {}, "spec": {"nodeSelector": {"a": "b"}}}),
    ],
    ids=["pod", "template-spec", "bare-pod-spec"],
)
def test_pod_templates(tmp_path, text, template) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    assert load_pod_template(str(path)) == template


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n", "must hold a mapping"),
        ("kind: Deployment\nspec: {}\n", "must be a Pod or a pod spec, got kind Deployment"),
        ("metadata: {name: x}\nspec: {}\n", "metadata.name is set by elastic-step"),
        ("metadata: {ownerReferences: []}\n", "metadata.ownerReferences is set by elastic-step"),
        ("metadata: {labels: {a: 1}}\n", "metadata.labels must map strings to strings"),
        ("spec: {restartPolicy: Always}\n", "spec.restartPolicy must be Never"),
        ("spec: {containers: [{image: x}]}\n", "spec.containers must be a list of mappings, each"),
        ("spec: [\n", "is not valid YAML"),
    ],
)
def test_bad_pod_templates(tmp_path, text, message) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as e:
        load_pod_template(str(path))
    assert f"--pod-template {path}" in str(e.value) and message in str(e.value)


def test_kubernetes_flags_with_another_backend_are_refused(capsys) -> None:
    from elastic_step.cli import main

    assert main([*BASE, "--worker-cpu", "2"]) == 2
    assert "--worker-cpu applies to --backend kubernetes only" in capsys.readouterr().err
    assert main([*BASE, "--dry-run"]) == 2
    assert "--dry-run needs --backend kubernetes" in capsys.readouterr().err
