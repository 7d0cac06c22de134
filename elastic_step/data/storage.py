"""The one storage layer: every file elastic-step reads or writes goes through here.

Paths are local paths or fsspec-style URIs (``file:///data/x``, ``s3://bucket/x``). A URI's
scheme picks a :class:`Storage` (storage_api.py) from a small registry; ``file`` (and plain
paths) is built in, and ``s3``, ``minio`` and ``gs`` are object stores (see
object_storage.py, which documents their configuration). Other schemes plug in with
:func:`register_storage` without touching any caller.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import IO

from elastic_step.data.storage_api import Storage
from elastic_step.errors import InputError

log = logging.getLogger(__name__)

#: Where :func:`set_aside` moves a bad file: a directory of this name beside it.
SET_ASIDE_DIR = "set-aside"
#: Bytes per read when a file is copied or hashed: a model's files can be hundreds of MB.
COPY_CHUNK = 1 << 20


class LocalStorage(Storage):
    """The local file system, for plain paths and ``file://`` URIs."""

    @staticmethod
    def _local(path: str) -> str:
        return path[len("file://") :] if path.startswith("file://") else path

    def open(self, path: str, mode: str = "rb") -> IO:
        return open(self._local(path), mode)

    def exists(self, path: str) -> bool:
        return os.path.exists(self._local(path))

    def isdir(self, path: str) -> bool:
        return os.path.isdir(self._local(path))

    def makedirs(self, path: str) -> None:
        os.makedirs(self._local(path), exist_ok=True)

    def listdir(self, path: str) -> list[str]:
        return sorted(os.listdir(self._local(path)))

    def rename(self, src: str, dst: str) -> None:
        os.replace(self._local(src), self._local(dst))

    def remove(self, path: str) -> None:
        local = self._local(path)
        if os.path.isdir(local) and not os.path.islink(local):
            shutil.rmtree(local, ignore_errors=True)
        elif os.path.lexists(local):
            os.remove(local)

    def size(self, path: str) -> int:
        return os.path.getsize(self._local(path))

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        with open(self._local(path), "rb") as f:
            f.seek(offset)
            return f.read(length)

    def write_atomic(self, path: str, data: bytes) -> None:
        with self.open_atomic(path) as f:
            f.write(data)

    @contextlib.contextmanager
    def open_atomic(self, path: str) -> Iterator[IO[bytes]]:
        # A temporary file beside it, made durable, then renamed over it (atomic on POSIX).
        local = self._local(path)
        os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
        tmp = f"{local}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, local)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise

    def publish_directory(self, tmp: str, path: str) -> None:
        # Two renames: between them ``path`` is briefly absent, never a mix of old and new.
        if self.exists(path):
            old = f"{path.rstrip('/')}.old-{uuid.uuid4().hex[:8]}"
            self.rename(path, old)
            self.rename(tmp, path)
            self.remove(old)
        else:
            self.rename(tmp, path)


#: The object stores that object_storage.py implements.
OBJECT_STORE_SCHEMES = ("gs", "minio", "s3")


def _object_store(scheme: str) -> Callable[[], Storage]:
    def build() -> Storage:
        # Imported on first use: s3fs and gcsfs are slow to import, and most runs need neither.
        from elastic_step.data.object_storage import object_storage_for

        return object_storage_for(scheme)

    return build


_REGISTRY: dict[str, Callable[[], Storage]] = {
    "file": LocalStorage,
    **{scheme: _object_store(scheme) for scheme in OBJECT_STORE_SCHEMES},
}
_INSTANCES: dict[str, Storage] = {}


def register_storage(scheme: str, factory: Callable[[], Storage]) -> None:
    """Makes URIs with ``scheme://`` use the storage that ``factory`` builds."""
    _REGISTRY[scheme] = factory
    _INSTANCES.pop(scheme, None)


def scheme_of(path: str) -> str:
    """The URI scheme of ``path``; ``file`` for a plain local path."""
    head, sep, _ = path.partition("://")
    return head if sep and head.isidentifier() else "file"


def storage_for(path: str) -> Storage:
    """The storage that handles ``path``; an :class:`InputError` for an unknown scheme."""
    scheme = scheme_of(path)
    if scheme not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY))
        raise InputError(f"{path}: no storage is registered for scheme '{scheme}' (known: {known})")
    if scheme not in _INSTANCES:
        _INSTANCES[scheme] = _REGISTRY[scheme]()
    return _INSTANCES[scheme]


def join(base: str, *parts: str) -> str:
    """Joins path parts with ``/``, for local paths and URIs alike."""
    path = base
    for part in parts:
        path = part if not path else f"{path.rstrip('/')}/{part.lstrip('/')}"
    return path


def parent(path: str) -> str:
    """The directory that holds ``path``."""
    stripped = path.rstrip("/")
    head, sep, _ = stripped.rpartition("/")
    return head if sep else "."


def is_local(path: str) -> bool:
    return scheme_of(path) == "file"


def local_path(path: str) -> str:
    """The local file-system path of a plain path or ``file://`` URI."""
    if not is_local(path):
        raise InputError(f"{path}: expected a local path")
    return os.path.abspath(LocalStorage._local(path))


def exists(path: str) -> bool:
    return storage_for(path).exists(path)


def isdir(path: str) -> bool:
    return storage_for(path).isdir(path)


def makedirs(path: str) -> None:
    storage_for(path).makedirs(path)


def listdir(path: str) -> list[str]:
    return storage_for(path).listdir(path)


def remove(path: str) -> None:
    storage_for(path).remove(path)


def size(path: str) -> int:
    return storage_for(path).size(path)


def open_file(path: str, mode: str = "rb") -> IO:
    return storage_for(path).open(path, mode)


def sha256_of(path: str) -> str:
    """The hex SHA-256 of a file's bytes, read a chunk at a time."""
    digest = hashlib.sha256()
    with open_file(path, "rb") as f:
        while chunk := f.read(COPY_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def read_bytes(path: str) -> bytes:
    with open_file(path, "rb") as f:
        return f.read()


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def read_range(path: str, offset: int, length: int) -> bytes:
    """Reads ``length`` bytes of ``path`` from byte ``offset``; no scan from the start (a
    ranged GET on an object store)."""
    data = storage_for(path).read_range(path, offset, length)
    if len(data) != length:
        raise InputError(f"{path}: wanted {length} bytes at offset {offset}, file ends early")
    return data


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Replaces ``path`` with ``data``: a reader sees the old content or the new, never a
    half-written file (a local file is written beside it and renamed, its directory made if
    need be; an object is one PUT)."""
    storage_for(path).write_atomic(path, data)


def write_text_atomic(path: str, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def open_atomic(path: str) -> contextlib.AbstractContextManager[IO[bytes]]:
    """``with open_atomic(path) as f:`` writes ``path`` as :func:`write_bytes_atomic` does,
    streaming: a local file beside it, renamed at the end; an object uploaded in parts,
    published when the upload completes and discarded on an exception."""
    return storage_for(path).open_atomic(path)


@contextlib.contextmanager
def atomic_directory(path: str) -> Iterator[str]:
    """Yields a temporary directory beside ``path``; on success it replaces ``path``.

    On an exception the temporary directory is removed and ``path`` is left as it was. How
    the finished directory takes the place of ``path`` is the storage's
    :meth:`Storage.publish_directory`: two renames locally; on an object store, which cannot
    rename a prefix, copies that publish the top-level files last.
    """
    store = storage_for(path)
    store.makedirs(parent(path))
    tmp = f"{path.rstrip('/')}.tmp-{uuid.uuid4().hex[:8]}"
    store.makedirs(tmp)
    try:
        yield tmp
    except BaseException:
        store.remove(tmp)
        raise
    store.publish_directory(tmp, path)


def set_aside(path: str, why: str) -> str:
    """Moves the bad file ``path`` into ``set-aside/`` beside it, its name prefixed with the
    time, so that nothing reads it again and nothing deletes it; logs one line saying why
    and where it went. Returns its new path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name = path.rstrip("/").rsplit("/", 1)[-1]
    destination = join(parent(path), SET_ASIDE_DIR, f"{stamp}-{uuid.uuid4().hex[:4]}-{name}")
    makedirs(parent(destination))
    storage_for(path).rename(path, destination)
    log.warning("%s: %s; set aside as %s", path, why, destination)
    return destination


def local_temp_dir(prefix: str = "elastic-step-") -> str:
    """A new local scratch directory; the caller removes it."""
    return tempfile.mkdtemp(prefix=prefix)


def copy_tree(local_dir: str, destination: str) -> None:
    """Copies a local directory's files into ``destination`` (any storage)."""
    for root, _, files in os.walk(local_dir):
        relative = os.path.relpath(root, local_dir)
        target = destination if relative == "." else join(destination, relative)
        makedirs(target)
        for name in files:
            with (
                open(os.path.join(root, name), "rb") as f,
                open_file(join(target, name), "wb") as out,
            ):
                shutil.copyfileobj(f, out, COPY_CHUNK)


def fetch(source: str, local_dir: str) -> str:
    """A local path holding ``source`` (a file or a directory, any storage): the path itself
    when it is local, else a copy under ``local_dir``."""
    if is_local(source):
        return local_path(source)
    destination = os.path.join(local_dir, os.path.basename(source.rstrip("/")))
    if not isdir(source):
        with open_file(source) as f, open(destination, "wb") as out:
            shutil.copyfileobj(f, out, COPY_CHUNK)
        return destination
    os.makedirs(destination, exist_ok=True)
    for name in listdir(source):
        fetch(join(source, name), destination)
    return destination
