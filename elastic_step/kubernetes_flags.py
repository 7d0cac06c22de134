"""The Kubernetes backend's command-line flags, the CLI's side of
:class:`~elastic_step.backends.kubernetes_options.KubernetesOptions`: argparse in, typed options
out. The backend never sees argparse. Tests: tests/unit/test_kubernetes_options.py and
tests/unit/test_storage_secret.py."""

from __future__ import annotations

import argparse
from typing import Any

from elastic_step.backends.kubernetes_options import (
    PULL_POLICIES,
    KubernetesOptions,
    RoleResources,
    load_pod_template,
    parse_key_value,
    parse_toleration,
    parse_volume,
)


def add_kubernetes_flags(parser: argparse.ArgumentParser, *, ps: bool = True) -> None:
    """Adds the Kubernetes backend's flags to ``elastic-step train`` (``ps``) or ``predict``
    (no PS: no PS flags, and no PS in their help)."""
    pods = "worker and PS" if ps else "worker"
    g = parser.add_argument_group(
        "kubernetes backend (--backend kubernetes)",
        f"How the master makes its {pods} pods. Requests equal limits.",
    )
    g.add_argument("--namespace", metavar="NS", help="(default: the master pod's namespace)")
    g.add_argument("--image", help=f"{pods} image (default: the master pod's image)")
    g.add_argument("--image-pull-policy", choices=PULL_POLICIES, help="(default: the cluster's)")
    g.add_argument(
        "--image-pull-secret",
        action="append",
        default=[],
        metavar="NAME",
        help="a Secret to pull the image with (repeatable)",
    )
    g.add_argument(
        "--service-account",
        metavar="NAME",
        help=f"ServiceAccount of {pods} pods (default: none; no token is mounted)",
    )
    for role in ("worker", "ps") if ps else ("worker",):
        g.add_argument(f"--{role}-cpu", metavar="QUANTITY", help=f"CPU of each {role} pod")
        g.add_argument(f"--{role}-memory", metavar="QUANTITY", help=f"memory of each {role} pod")
    g.add_argument("--worker-gpu", type=int, default=0, metavar="N", help="GPUs of each worker")
    g.add_argument(
        "--node-selector",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="run pods only on nodes with this label (repeatable)",
    )
    g.add_argument(
        "--toleration",
        action="append",
        default=[],
        metavar="KEY[=VALUE]:EFFECT",
        help="tolerate a taint (repeatable)",
    )
    g.add_argument("--worker-priority-class", metavar="NAME", help="PriorityClass of workers")
    g.add_argument(
        "--high-priority-class",
        metavar="NAME",
        help=("PriorityClass of PS pods and of " if ps else "PriorityClass of ")
        + "--high-priority-fraction of the worker slots",
    )
    g.add_argument(
        "--high-priority-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="fraction of worker slots that get --high-priority-class, so that preemption "
        "never takes every worker (default 0)",
    )
    g.add_argument(
        "--volume",
        action="append",
        default=[],
        metavar="claim=NAME,mount=/PATH[,readonly][,subpath=DIR]",
        help="mount a PersistentVolumeClaim in every pod (repeatable)",
    )
    g.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="(repeatable)")
    g.add_argument(
        "--pod-template",
        metavar="FILE.yaml",
        help="a pod (or pod spec) merged into every pod; containers merge by name, the "
        "elastic-step container is 'main'",
    )
    g.add_argument("--kubeconfig", metavar="FILE", help="(default: in-cluster, or ~/.kube/config)")
    g.add_argument(
        "--storage-secret",
        metavar="NAME",
        help=f"a Secret with the object store's credentials, given to every {pods} pod as "
        "env: keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, optional AWS_SESSION_TOKEN, "
        "AWS_ENDPOINT_URL and AWS_REGION; KFP's mlpipeline-minio-artifact is read by its keys "
        "accesskey and secretkey",
    )


#: argparse destinations of the Kubernetes flags, with the value that means "not given".
FLAG_DEFAULTS: dict[str, Any] = {
    "namespace": None,
    "image": None,
    "image_pull_policy": None,
    "image_pull_secret": [],
    "service_account": None,
    "worker_cpu": None,
    "worker_memory": None,
    "ps_cpu": None,
    "ps_memory": None,
    "worker_gpu": 0,
    "node_selector": [],
    "toleration": [],
    "worker_priority_class": None,
    "high_priority_class": None,
    "high_priority_fraction": 0.0,
    "volume": [],
    "env": [],
    "pod_template": None,
    "kubeconfig": None,
    "storage_secret": None,
}


def kubernetes_flags_given(args: argparse.Namespace) -> list[str]:
    """The Kubernetes flags set on the command line, as flags (``--image``)."""
    return [
        "--" + dest.replace("_", "-")
        for dest, default in FLAG_DEFAULTS.items()
        if getattr(args, dest, default) != default
    ]


def options_from_args(args: argparse.Namespace) -> KubernetesOptions:
    """The options from parsed flags (reads --pod-template)."""
    template = load_pod_template(args.pod_template) if args.pod_template else None
    return KubernetesOptions(
        namespace=args.namespace,
        image=args.image,
        image_pull_policy=args.image_pull_policy,
        image_pull_secrets=tuple(args.image_pull_secret),
        service_account=args.service_account,
        worker=RoleResources(cpu=args.worker_cpu, memory=args.worker_memory, gpu=args.worker_gpu),
        ps=RoleResources(
            cpu=getattr(args, "ps_cpu", None), memory=getattr(args, "ps_memory", None)
        ),
        node_selector=dict(parse_key_value("--node-selector", item) for item in args.node_selector),
        tolerations=tuple(parse_toleration(item) for item in args.toleration),
        worker_priority_class=args.worker_priority_class,
        high_priority_class=args.high_priority_class,
        high_priority_fraction=args.high_priority_fraction,
        volumes=tuple(parse_volume(item) for item in args.volume),
        env=dict(parse_key_value("--env", item) for item in args.env),
        pod_template=template,
        pod_template_path=args.pod_template,
        kubeconfig=args.kubeconfig,
        storage_secret=args.storage_secret,
    )
