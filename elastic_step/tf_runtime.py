"""TensorFlow start-up without its C++ banner.

TensorFlow 2.21 prints oneDNN and CUDA-probing lines to stderr from C++ before its log
settings apply, so TF_CPP_MIN_LOG_LEVEL cannot hide them. They would bury the master's own
log. Python errors are unaffected: stderr is restored before they propagate.
"""

from __future__ import annotations

import os
import sys


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow and probes its devices with file descriptor 2 sent to /dev/null."""
    if "tensorflow" in sys.modules or os.environ.get("ELASTIC_STEP_TF_LOGS") == "1":
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        import tensorflow as tf

        tf.config.list_physical_devices()
        tf.constant(0)  # the first op runs device set-up, which logs too
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
