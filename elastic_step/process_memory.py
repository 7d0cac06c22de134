"""A master process's memory: kept small, and what it frees given back to the system.

A master holds TensorFlow (about 0.7 GB, most of it its libraries) for the whole job; the
model it checks and, in ``predict``, the input it encodes come and go. With the C library's
and Arrow's default allocators much of what they free stays in the process:

- glibc raises its mmap threshold to the largest block freed so far (up to 32 MB), so later
  blocks of that size come from the heap, which it seldom shrinks;
- Arrow's default pool (mimalloc) keeps the pages it freed for reuse.

Encoding 10 million rows for ``predict`` then grew the master by 400 MB, over a peak of 190
MB of Arrow's own data (bench/README.md, "Where the master's memory goes"). So a master
fixes glibc's threshold at :data:`MMAP_THRESHOLD` (a larger block is mapped on its own and
unmapped when freed), takes Arrow's blocks from the system allocator, and calls
:func:`release_freed_memory` after a model check. Workers, the PS and ``preprocess`` keep the
defaults, which are faster for their steady work.
Tests: tests/unit/test_process_memory.py.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger(__name__)

#: Blocks at least this large are mapped by themselves, and unmapped when freed.
MMAP_THRESHOLD = 256 * 1024
#: glibc's mallopt parameter for it (malloc.h).
_M_MMAP_THRESHOLD = -3


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def configure_master_memory() -> None:
    """Fixes glibc's mmap threshold and puts Arrow on the system allocator, for a master
    process; before it allocates much. Where the C library is not glibc, only Arrow's."""
    import pyarrow as pa

    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is not None and not mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        log.debug("mallopt(M_MMAP_THRESHOLD) was refused; glibc's default threshold stays")
    pa.set_memory_pool(pa.system_memory_pool())


def release_freed_memory() -> None:
    """Gives what the process freed back to the system: a collection (a Keras model and its
    lookup tables are in reference cycles), then glibc's ``malloc_trim``, which returns the
    free pages inside the heap that ``free`` keeps for later."""
    gc.collect()
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)
