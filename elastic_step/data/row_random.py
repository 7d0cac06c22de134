"""Randomness keyed by row number, so that a row's fate does not depend on how rows are batched.

Preprocessing streams a file in batches whose size depends on the reader and on memory
settings. Every random choice about a row is a pure function of ``(seed, purpose, row
number)``: the same file and seed give the same output, byte for byte, whatever the batching.
Tests: tests/unit/test_preprocess_streaming.py (the same output whatever the budget) and
tests/unit/test_preprocess.py (a split fixed by the seed).
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection of uint64 that scatters nearby inputs."""
    x = x.copy()
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def stream_key(seed: int, purpose: str) -> int:
    """A 64-bit key for one use of randomness (``purpose``) under ``seed``."""
    word = np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    for byte in purpose.encode("utf-8"):
        word = _mix(word ^ np.uint64(byte))
    return int(word[0])


def row_keys(key: int, rows: np.ndarray) -> np.ndarray:
    """A uniformly distributed uint64 per row number in ``rows``, under ``key``."""
    with np.errstate(over="ignore"):
        return _mix(rows.astype(np.uint64) * _GOLDEN + np.uint64(key))


class Permutation:
    """A keyed pseudo-random bijection of ``[0, size)``.

    A balanced Feistel network on the smallest even number of bits that holds ``size``; values
    that land outside ``[0, size)`` are encrypted again until they fall inside ("cycle
    walking"), which takes under four rounds on average since the domain is below ``4 * size``.
    """

    ROUNDS = 4

    def __init__(self, size: int, key: int) -> None:
        bits = max(2, (max(size, 1) - 1).bit_length())
        self._half = (bits + 1) // 2
        self._mask = np.uint64((1 << self._half) - 1)
        self._size = size
        self._round_keys = [stream_key(key, f"round {r}") for r in range(self.ROUNDS)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        half = np.uint64(self._half)
        left, right = x >> half, x & self._mask
        for round_key in self._round_keys:
            left, right = right, left ^ (row_keys(round_key, right) & self._mask)
        return (left << half) | right

    def __call__(self, index: np.ndarray) -> np.ndarray:
        """The images of ``index`` (values in ``[0, size)``)."""
        out = self._encrypt(index.astype(np.uint64))
        outside = np.flatnonzero(out >= self._size)
        while outside.size:
            out[outside] = self._encrypt(out[outside])
            outside = outside[out[outside] >= self._size]
        return out.astype(np.int64)
