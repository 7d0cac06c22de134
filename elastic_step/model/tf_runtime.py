"""TensorFlow start-up: without its C++ banner, and with thread pools sized to the container.

TensorFlow 2.21 prints oneDNN and CUDA-probing lines to stderr from C++ before its log
settings apply, so TF_CPP_MIN_LOG_LEVEL cannot hide them. They would bury the master's own
log. Python errors are unaffected: stderr is restored before they propagate.

In a container TensorFlow sizes its thread pools from the cores it may be scheduled on (the
node's, often dozens), not from the container's CPU limit, which the kernel enforces by
throttling: with a 2-CPU limit on a 32-core node it runs 32 intra-op and 32 inter-op threads
that the quota stops every period. The Kubernetes backend gives each worker and PS its CPU
limit (downward API ``limits.cpu``, rounded up to a whole CPU) in ``ELASTIC_STEP_CPU_LIMIT``;
:func:`configure_threads` then sets intra-op parallelism to that many threads and inter-op
parallelism to :func:`inter_op_threads` of it. Without the variable TensorFlow's defaults
stay.
Tests: tests/unit/test_kubernetes_tf_threads.py (the thread pools).
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Mapping

log = logging.getLogger(__name__)

#: Whole CPUs of the container's limit, set by the Kubernetes backend.
CPU_LIMIT_ENV = "ELASTIC_STEP_CPU_LIMIT"


def inter_op_threads(cpus: int) -> int:
    """Inter-op threads for ``cpus`` CPUs: 1 for one CPU, else 2.

    Inter-op threads run independent ops side by side; each op's own work goes to the
    intra-op pool, which already has one thread per CPU. A worker's step and a PS's updates
    have little op-level parallelism (a chain of layers; a few variables per request), so
    more inter-op threads only add runnable threads that the CPU quota throttles. Two keep an
    input-pipeline op or a small op running while a big one fills the intra-op pool. This
    follows Intel's guidance for TensorFlow on CPUs (inter-op threads: the number of sockets,
    one or two; intra-op: the cores). It is not measured here: on the shared 2-core build
    machine, repeats of one setting under a 1-CPU cgroup quota differed by 3-7x.
    """
    return 1 if cpus <= 1 else 2


def thread_counts(environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """(intra-op, inter-op) threads from ``ELASTIC_STEP_CPU_LIMIT``; None to keep TensorFlow's
    defaults (unset, or not a positive number)."""
    text = (os.environ if environ is None else environ).get(CPU_LIMIT_ENV, "").strip()
    if not text:
        return None
    try:
        cpus = math.ceil(float(text))
    except ValueError:
        cpus = 0
    if not 1 <= cpus <= 4096:
        log.warning("ignoring %s=%r: not a positive number of CPUs", CPU_LIMIT_ENV, text)
        return None
    return cpus, inter_op_threads(cpus)


def configure_threads(environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """Sizes TensorFlow's thread pools from the CPU limit (see the module docstring), before
    TensorFlow runs its first op. Returns the (intra, inter) counts set, or None when it
    leaves the defaults. Idempotent."""
    counts = thread_counts(environ)
    if counts is None:
        return None
    import tensorflow as tf

    threading = tf.config.threading
    current = (
        threading.get_intra_op_parallelism_threads(),
        threading.get_inter_op_parallelism_threads(),
    )
    if current == counts:
        return counts
    try:
        threading.set_intra_op_parallelism_threads(counts[0])
        threading.set_inter_op_parallelism_threads(counts[1])
    except RuntimeError as e:
        log.warning(
            "cannot size TensorFlow's threads from %s (%s): it is already running", CPU_LIMIT_ENV, e
        )
        return None
    return counts


_started = False

#: TensorFlow's switch for oneDNN's CPU kernels, read once, as it is imported.
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"


def import_tensorflow_quietly(*, quietly: bool = True, master: bool = False) -> None:
    """Imports TensorFlow and probes its devices, with file descriptor 2 sent to /dev/null
    when ``quietly`` (and ``ELASTIC_STEP_TF_LOGS`` is not 1).

    Thread pools are sized (:func:`configure_threads`) between the import and the first op.
    Once per process: an instance forked from the local backend's fork server finds
    TensorFlow imported but not started, and starts it here.

    ``master``: the process is a job's master (``train``, ``predict``), which computes
    nothing heavy; TensorFlow is imported with oneDNN's kernels off, unless
    ``TF_ENABLE_ONEDNN_OPTS`` is set. oneDNN keeps the memory of what it ran in a pool of its
    own, so a master would hold the model it checked for the whole job (bench/README.md,
    "Where the master's memory goes"). The variable is unset again after the import: the
    workers and PS that the master starts do not inherit it.
    """
    global _started
    if _started:
        return
    _started = True
    quietly = quietly and os.environ.get("ELASTIC_STEP_TF_LOGS") != "1"
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    onednn_off = master and ONEDNN_ENV not in os.environ
    try:
        if quietly:
            os.dup2(devnull, 2)
        if onednn_off:
            os.environ[ONEDNN_ENV] = "0"
        import tensorflow as tf

        configure_threads()
        tf.config.list_physical_devices()
        tf.constant(0)  # the first op runs device set-up, which logs too
    finally:
        if onednn_off:
            os.environ.pop(ONEDNN_ENV, None)
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def set_random_seed(seed: int) -> None:
    """Seeds Python's, NumPy's and the backend's generators: every process that builds the
    model (the workers, and the master for the final and best models and the round metrics)
    must start alike."""
    import keras

    keras.utils.set_random_seed(seed)
