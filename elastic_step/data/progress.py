"""Progress lines for long passes over an input, at most one every few seconds.
Tests: tests/unit/test_preprocess_streaming.py (test_keras_input_names reads its lines)."""

from __future__ import annotations

import time
from collections.abc import Callable


class Progress:
    """Throttled progress lines for long inputs: at most one per ``every_s`` seconds."""

    def __init__(self, say: Callable[[str], None], *, what: str, total_bytes: int, every_s: float):
        self._say = say
        self._what = what
        self._total = total_bytes
        self._every = every_s
        self._last = time.monotonic()
        self._done_bytes = 0
        self._rows = 0

    def add(self, done_bytes: int, rows: int) -> None:
        """Counts ``done_bytes`` and ``rows`` more, and reports the totals when it is time."""
        self._done_bytes += done_bytes
        self._rows += rows
        self(self._done_bytes, self._rows)

    def __call__(self, done_bytes: int, rows: int) -> None:
        """Reports ``done_bytes`` of the total and ``rows`` so far, when it is time."""
        now = time.monotonic()
        if now - self._last < self._every:
            return
        self._last = now
        share = f" ({100 * done_bytes / self._total:.0f}%)" if self._total else ""
        self._say(
            f"{self._what}: {rows:,} rows, {_size(done_bytes)} of {_size(self._total)}{share}"
        )


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError(n)
