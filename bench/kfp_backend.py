"""The example pipeline on Kubeflow Pipelines' own backend against the same pipeline under
``kfp.local``, side by side in one run.

KFP side: the test control plane with Argo's controller and KFP 2.17.0's backend (the API
server, the persistence agent, ML Metadata; the driver and launcher in the pods), as
``make test-argo`` starts them (tests/cluster/argo.py, kfp_backend.py). The compiled
``pipelines/kfp_pipeline.yaml`` is uploaded with ``kfp.Client`` and run ``--runs`` times,
one after another; each run is timed from the create call until the client reads it
SUCCEEDED (polled every second), and by KFP's own ``created_at`` and ``finished_at``. The
first run computes preprocess; KFP serves it from its cache to the later runs (training
always runs: the pipeline turns its cache off).

kfp.local side: ``elastic_step_pipeline`` called under ``kfp.local.SubprocessRunner``
(``use_venv=False``) in a child process, with the same parameters and ``backend="local"``
(the masters start their workers and PS as local processes): timed from the call to its
return, ``--runs`` times (kfp.local has no cache).

Both sides train the same job: 2 workers, 1 PS, ``--epochs`` epochs of scikit-learn's breast
cancer data. The ratio is KFP's median over kfp.local's. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

from common import REPO, log, run_header, write_result

sys.path.insert(0, str(Path(REPO) / "tests"))
sys.path.insert(0, str(Path(REPO) / "tests" / "cluster"))
sys.path.insert(0, str(Path(REPO) / "tests" / "argo"))
import boto3
from argo import build_argo, start_argo
from example_data import write_breast_cancer_csv
from host_services import service_address
from kfp_backend import (
    KFP_BUCKET,
    OBJECT_STORE_ADDRESS,
    OBJECT_STORE_PORT,
    build_kfp,
    start_kfp,
)
from kfp_helpers import client_for, run_example, upload_example_inputs
from local_cluster import build_binary, start_cluster, wait_for
from mlmd import build_mlmd
from s3_server import S3Server

LOCAL_RUN = textwrap.dedent(
    """
    import sys, time, warnings
    warnings.simplefilter("ignore")
    from kfp import local
    from elastic_step.examples import path_of
    from pipelines.kfp_pipeline import elastic_step_pipeline
    csv, root, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root)
    started = time.monotonic()
    elastic_step_pipeline(csv_uri=csv, label="benign", model_def_uri=path_of("breast_cancer"),
                          epochs=epochs, workers=2, max_workers=2, ps=1, backend="local")
    print(f"SECONDS {time.monotonic() - started:.3f}")
    """
)


def kfp_local_runs(csv: Path, work: Path, args: argparse.Namespace) -> list[float]:
    seconds = []
    for index in range(args.runs):
        result = subprocess.run(
            [sys.executable, "-c", LOCAL_RUN, str(csv), str(work / f"local-{index}"),
             str(args.epochs)],
            cwd=REPO, capture_output=True, text=True, timeout=1800, check=True,
        )  # fmt: skip
        (line,) = [x for x in result.stdout.splitlines() if x.startswith("SECONDS ")]
        seconds.append(float(line.split()[1]))
        log(f"kfp.local run {index + 1}: {seconds[-1]:.1f} s")
    return seconds


def kfp_backend_runs(csv: Path, work: Path, args: argparse.Namespace) -> dict:
    built = {"cluster": build_binary(), "argo": build_argo(), "kfp": build_kfp()}
    mlmd_venv = build_mlmd()
    s3 = S3Server()
    try:
        boto3.client("s3", **s3.client_kwargs()).create_bucket(Bucket="elastic-step")
        boto3.client("s3", **s3.client_kwargs()).create_bucket(Bucket=KFP_BUCKET)
        upload_example_inputs(s3.client_kwargs(), csv)
        (work / "cluster").mkdir()
        (work / "kfp").mkdir()
        with contextlib.ExitStack() as stack:
            started = time.monotonic()
            cluster = stack.enter_context(
                start_cluster(
                    work / "cluster", built["cluster"], pod_path=[built["argo"], built["kfp"]]
                )
            )
            stack.enter_context(
                start_argo(cluster, built["argo"], s3_env=s3.env(), bucket="elastic-step")
            )
            address = service_address(cluster.pod_cidr, OBJECT_STORE_ADDRESS)
            store = s3.serve_also(address, OBJECT_STORE_PORT).removeprefix("http://")
            kfp = stack.enter_context(
                start_kfp(
                    cluster,
                    built["kfp"],
                    mlmd_venv,
                    work / "kfp",
                    s3_env=s3.env(),
                    object_store=store,
                )
            )
            startup = time.monotonic() - started
            log(f"control plane, Argo and KFP's backend up in {startup:.1f} s")
            user = client_for(kfp.api.http)
            client_s, server_s = [], []
            for index in range(args.runs):
                begun = time.monotonic()
                run_id = run_example(user, epochs=args.epochs, max_workers=2,
                                     worker_memory="768Mi", ps_memory="768Mi")  # fmt: skip

                def ended(run_id: str = run_id):
                    run = user.get_run(run_id)
                    return run if str(run.state) in ("SUCCEEDED", "FAILED", "CANCELED") else None

                run = wait_for(f"run {run_id}", ended, timeout=1800, interval=1.0)
                if str(run.state) != "SUCCEEDED":
                    raise RuntimeError(f"run {run_id} ended {run.state}")
                client_s.append(time.monotonic() - begun)
                server_s.append((run.finished_at - run.created_at).total_seconds())
                log(f"KFP run {index + 1}: {client_s[-1]:.1f} s (KFP's own: {server_s[-1]:.0f} s)")
            return {"startup_s": startup, "client_s": client_s, "server_s": server_s}
    finally:
        s3.stop()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="The example pipeline on KFP's own backend against kfp.local.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=2, help="runs on each side")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of the training step")
    parser.add_argument("--output", default="kfp_backend.json", help="where the result goes")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.epochs < 1:
        parser.error(f"--runs {args.runs} and --epochs {args.epochs} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory(prefix="bench-kfp-") as tmp:
        work = Path(tmp)
        csv = work / "breast_cancer.csv"
        write_breast_cancer_csv(csv)
        local_s = kfp_local_runs(csv, work, args)
        backend = kfp_backend_runs(csv, work, args)
    local_median = statistics.median(local_s)
    kfp_median = statistics.median(backend["client_s"])
    print()
    print(f"== the example pipeline, {args.epochs} epochs, {args.runs} runs each (seconds) ==")
    print(f"kfp.local (backend local):        {' '.join(f'{s:.1f}' for s in local_s)}")
    print(f"KFP 2.17.0's backend (kubernetes): {' '.join(f'{s:.1f}' for s in backend['client_s'])}")
    print(f"KFP's own created -> finished:     {' '.join(f'{s:.0f}' for s in backend['server_s'])}")
    print(f"ratio of the medians, KFP / kfp.local: {kfp_median / local_median:.2f}")
    print(f"(the backend's start, not in the runs: {backend['startup_s']:.1f} s)")
    write_result(
        args.output,
        {
            **run_header(),
            "settings": vars(args),
            "kfp_local_s": local_s,
            "kfp_backend": backend,
            "ratio_of_medians": kfp_median / local_median,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
