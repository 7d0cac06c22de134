"""A master process's memory (elastic_step/process_memory.py): Arrow on the system allocator,
and what the process freed given back to the system. Each case runs in a process of its own:
the settings are process-wide."""

from __future__ import annotations

import subprocess
import sys

import pytest

RSS = "int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1]) // 1024"


def run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_a_master_takes_arrows_blocks_from_the_system_allocator() -> None:
    code = (
        "import pyarrow as pa; before = pa.default_memory_pool().backend_name; "
        "from elastic_step.process_memory import configure_master_memory; "
        "configure_master_memory(); print(before, pa.default_memory_pool().backend_name)"
    )
    before, after = run(code).split()
    assert before != "system" and after == "system"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_memory_goes_back_to_the_system() -> None:
    # 200 MB of 100 KB blocks, each followed by a 1 KB one (past Python's own allocator)
    # that stays: the freed blocks are holes in the heap, which free() cannot give back and
    # malloc_trim can.
    code = f"""
from elastic_step.process_memory import release_freed_memory
blocks, pins = [], []
for i in range(2000):
    blocks.append(bytearray(100_000)); blocks[-1][::4096] = b"x" * len(blocks[-1][::4096])
    pins.append(bytearray(1000))
held = {RSS}
del blocks
freed = {RSS}
release_freed_memory()
print(held, freed, {RSS})
"""
    held, freed, released = map(int, run(code).split())
    assert freed > held - 50, (held, freed)  # free() alone keeps the holes
    assert released < freed - 150, (held, freed, released)
