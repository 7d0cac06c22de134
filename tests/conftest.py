"""Shared test settings: quiet TensorFlow in every process the tests start."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
