"""Keras input names for CSV column names.

``keras.Input`` refuses a name with ``/``, and a SavedModel signature refuses spaces and most
punctuation. A column name made of ASCII letters, digits, ``_``, ``.`` and ``-``, starting
with a letter or digit, is used as it is; any other is mapped to one: each run of other
characters becomes ``_`` (``od280/od315 ratio`` -> ``od280_od315_ratio``), and a suffix
``_2``, ``_3``... keeps the names unique.
Tests: tests/unit/test_preprocess_streaming.py (test_keras_input_names).
"""

from __future__ import annotations

import re

_VALID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_INVALID_RUN = re.compile(r"[^A-Za-z0-9_.\-]+")


def is_valid_input_name(name: str) -> bool:
    return _VALID.fullmatch(name) is not None


def input_names(names: list[str]) -> list[str]:
    """One valid, distinct input name per (distinct) column name in ``names``, in order."""
    taken = {name for name in names if is_valid_input_name(name)}
    result = []
    for position, name in enumerate(names, start=1):
        if is_valid_input_name(name):
            result.append(name)
            continue
        # Stripped of leading "_.-", what is left starts with a letter or digit.
        base = _INVALID_RUN.sub("_", name).strip("_.-") or f"column_{position}"
        candidate, suffix = base, 2
        while candidate in taken:
            candidate, suffix = f"{base}_{suffix}", suffix + 1
        taken.add(candidate)
        result.append(candidate)
    return result
