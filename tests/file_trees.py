"""The files under a directory, for tests that compare what two paths wrote, byte for byte."""

from __future__ import annotations

from pathlib import Path


def tree(directory: Path) -> dict[str, bytes]:
    """Each file under ``directory``, by its path relative to it, with its bytes."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
