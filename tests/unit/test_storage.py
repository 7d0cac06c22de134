"""The storage layer: paths, atomic writes, ranged reads, atomic directories, schemes."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_step.data import storage
from elastic_step.errors import InputError


def test_join_and_parent() -> None:
    assert storage.join("a", "b", "c.txt") == "a/b/c.txt"
    assert storage.join("s3://bucket/", "/x") == "s3://bucket/x"
    assert storage.parent("a/b/c.txt") == "a/b"
    assert storage.parent("c.txt") == "."


def test_scheme_of_and_unknown_scheme() -> None:
    assert storage.scheme_of("/tmp/x") == "file"
    assert storage.scheme_of("file:///tmp/x") == "file"
    assert storage.scheme_of("s3://bucket/x") == "s3"
    with pytest.raises(InputError, match=r"nosuch://x: no storage is registered"):
        storage.storage_for("nosuch://x")


def test_file_uri_and_plain_path_are_the_same_file(tmp_path: Path) -> None:
    path = str(tmp_path / "f.bin")
    storage.write_bytes_atomic(f"file://{path}", b"hello")
    assert storage.read_bytes(path) == b"hello"
    assert storage.exists(f"file://{path}")
    assert storage.size(path) == 5
    assert storage.local_path(f"file://{path}") == path


def test_write_atomic_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    path = str(tmp_path / "f.txt")
    storage.write_text_atomic(path, "one")
    storage.write_text_atomic(path, "two")
    assert storage.read_text(path) == "two"
    assert storage.listdir(str(tmp_path)) == ["f.txt"]


def test_write_atomic_makes_the_directory(tmp_path: Path) -> None:
    # A pipeline step's output path (/tmp/outputs/metrics.json) may name a directory that
    # nothing made yet.
    path = str(tmp_path / "outputs" / "metrics.json")
    storage.write_text_atomic(path, "{}")
    assert storage.read_text(path) == "{}"


def test_read_range(tmp_path: Path) -> None:
    path = str(tmp_path / "f.bin")
    storage.write_bytes_atomic(path, bytes(range(100)))
    assert storage.read_range(path, 10, 5) == bytes(range(10, 15))
    assert storage.read_range(path, 99, 1) == bytes([99])
    with pytest.raises(InputError, match="file ends early"):
        storage.read_range(path, 95, 10)


def test_makedirs_listdir_remove(tmp_path: Path) -> None:
    d = storage.join(str(tmp_path), "a", "b")
    storage.makedirs(d)
    storage.makedirs(d)  # no error if it exists
    storage.write_text_atomic(storage.join(d, "z.txt"), "z")
    storage.write_text_atomic(storage.join(d, "a.txt"), "a")
    assert storage.isdir(d)
    assert storage.listdir(d) == ["a.txt", "z.txt"]
    storage.remove(storage.join(str(tmp_path), "a"))
    assert not storage.exists(d)
    storage.remove(d)  # absent: no error


def test_atomic_directory_success_replaces_old(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    storage.makedirs(out)
    storage.write_text_atomic(storage.join(out, "old.txt"), "old")
    with storage.atomic_directory(out) as tmp:
        storage.write_text_atomic(storage.join(tmp, "new.txt"), "new")
        assert not storage.exists(storage.join(out, "new.txt"))  # not visible until done
    assert storage.listdir(out) == ["new.txt"]
    assert storage.listdir(str(tmp_path)) == ["out"]


def test_atomic_directory_failure_leaves_old(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    storage.makedirs(out)
    storage.write_text_atomic(storage.join(out, "old.txt"), "old")
    with pytest.raises(RuntimeError), storage.atomic_directory(out) as tmp:
        storage.write_text_atomic(storage.join(tmp, "new.txt"), "new")
        raise RuntimeError("boom")
    assert storage.listdir(out) == ["old.txt"]
    assert storage.listdir(str(tmp_path)) == ["out"]


def test_atomic_directory_failure_creates_nothing(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    with pytest.raises(RuntimeError), storage.atomic_directory(out):
        raise RuntimeError("boom")
    assert storage.listdir(str(tmp_path)) == []


def test_register_storage_routes_a_scheme(tmp_path: Path) -> None:
    """A registered scheme maps onto another storage without callers changing."""

    class Prefixed(storage.LocalStorage):
        @staticmethod
        def _local(path: str) -> str:
            return str(tmp_path / path[len("mem://") :])

    storage.register_storage("mem", Prefixed)
    try:
        storage.write_bytes_atomic("mem://x.bin", b"abc")
        assert (tmp_path / "x.bin").read_bytes() == b"abc"
        assert storage.read_range("mem://x.bin", 1, 2) == b"bc"
    finally:
        storage._REGISTRY.pop("mem", None)
        storage._INSTANCES.pop("mem", None)
