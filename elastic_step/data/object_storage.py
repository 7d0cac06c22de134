"""Object stores, through fsspec's own file systems: s3fs for ``s3://`` and ``minio://``,
gcsfs for ``gs://``.

Configuration comes from the environment; this is the one place that lists it.

``s3://BUCKET/KEY``: Amazon S3, or any S3-compatible server.
  - ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN``), or any other
    source of botocore's credential chain (``~/.aws``, a web identity, an instance role);
  - ``AWS_REGION`` or ``AWS_DEFAULT_REGION``;
  - ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``: the server, when it is not AWS.
``minio://BUCKET/KEY``: a bucket on Kubeflow Pipelines' object store, spoken to as S3 with the
  same variables; the endpoint defaults to KFP 2.17's, ``http://seaweedfs.kubeflow:9000``.
``gs://BUCKET/KEY``: Google Cloud Storage, with gcsfs's defaults
  (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's credentials, the metadata server).

Failure is bounded: botocore makes at most 3 attempts of a request, with 5 s to connect
and 30 s to read, and s3fs repeats a timed-out request at most twice. A rejected credential,
a missing bucket or an unreachable endpoint raises an :class:`InputError` of one line that
names the URI and what is wrong.

Object stores have no directories and no rename: a "directory" is a key prefix, a rename is
a copy and a delete. What stays atomic: one object appears whole or not at all (a PUT, or a
multipart upload, is published when it completes), so :meth:`ObjectStorage.write_atomic` is
a single PUT. See :meth:`ObjectStorage.publish_directory` for directories.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

from elastic_step.data.storage_api import Storage
from elastic_step.errors import InputError

# Each new client logs at INFO where it found the credentials: noise among the job's lines.
for _name in ("botocore.credentials", "aiobotocore.credentials"):
    logging.getLogger(_name).setLevel(logging.WARNING)

#: Where a default install of KFP 2.17 serves minio:// inside the cluster: SeaweedFS's
#: Service in the kubeflow namespace, on the port it keeps for MinIO's clients (the endpoint
#: KFP's launcher defaults to, objectstore.DefaultEndpointInMultiUserMode). Older releases
#: shipped MinIO at minio-service.kubeflow:9000; set AWS_ENDPOINT_URL for that.
KFP_MINIO_ENDPOINT = "http://seaweedfs.kubeflow:9000"
GCS_ENDPOINT = "https://storage.googleapis.com"

#: botocore's attempts per request (the first and up to two retries), and its timeouts.
MAX_ATTEMPTS = 3
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 30
#: s3fs's own repeats of a request that timed out or broke off (its default is 5).
S3FS_RETRIES = 2

#: What an S3 error code says about the credentials that made the request.
_CREDENTIAL_ERRORS = {
    "InvalidAccessKeyId": "rejected the access key id (AWS_ACCESS_KEY_ID)",
    "SignatureDoesNotMatch": "rejected the secret access key (AWS_SECRET_ACCESS_KEY)",
    "ExpiredToken": "rejected the session token (AWS_SESSION_TOKEN) as expired",
    "InvalidToken": "rejected the session token (AWS_SESSION_TOKEN)",
}
_DENIED = "denied access: the credentials were rejected or lack permission"
#: The errors of a store that cannot be reached, by what happened.
_UNREACHABLE = {
    "EndpointConnectionError": "cannot connect to",
    "ClientConnectorError": "cannot connect to",
    "ConnectTimeoutError": "timed out connecting to",
    "ReadTimeoutError": "timed out reading from",
    "ServerTimeoutError": "timed out reading from",
    "ConnectionClosedError": "lost the connection to",
}


@dataclass(frozen=True, kw_only=True)
class S3Settings:
    """Where an S3-compatible store is; the credentials are botocore's to find."""

    #: None: AWS itself.
    endpoint_url: str | None = None
    region: str | None = None

    @classmethod
    def from_env(cls, scheme: str, env: Mapping[str, str] = os.environ) -> S3Settings:
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        if endpoint is None and scheme == "minio":
            endpoint = KFP_MINIO_ENDPOINT
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
        return cls(endpoint_url=endpoint, region=region)

    @property
    def endpoint(self) -> str:
        """The endpoint, as error messages name it."""
        if self.endpoint_url:
            return self.endpoint_url
        return f"AWS S3 ({self.region})" if self.region else "AWS S3"

    def filesystem(self) -> Any:
        import s3fs

        config: dict[str, Any] = {
            # botocore >= 1.36 sends and checks CRC checksums by default, which MinIO, moto
            # and other S3-compatible servers may not support; AWS needs them only where an
            # operation requires them.
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
            "retries": {"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
            "connect_timeout": CONNECT_TIMEOUT_S,
            "read_timeout": READ_TIMEOUT_S,
        }
        if self.endpoint_url:
            # BUCKET.host names do not resolve on a server such as seaweedfs.kubeflow.
            config["s3"] = {"addressing_style": "path"}
        fs = s3fs.S3FileSystem(
            endpoint_url=self.endpoint_url,
            client_kwargs={"region_name": self.region} if self.region else {},
            config_kwargs=config,
            # Other processes (workers, PS, a later master) write the same prefixes: list
            # the store itself, never a cached listing.
            use_listings_cache=False,
            skip_instance_cache=True,
        )
        fs.retries = S3FS_RETRIES
        return fs


def object_storage_for(scheme: str, env: Mapping[str, str] = os.environ) -> ObjectStorage:
    """The storage of ``scheme`` (``s3``, ``minio`` or ``gs``), configured from ``env``."""
    if scheme == "gs":
        import gcsfs

        fs = gcsfs.GCSFileSystem(use_listings_cache=False, skip_instance_cache=True)
        return ObjectStorage(scheme=scheme, fs=fs, endpoint=GCS_ENDPOINT)
    if scheme in ("s3", "minio"):
        settings = S3Settings.from_env(scheme, env)
        return S3Storage(scheme=scheme, fs=settings.filesystem(), endpoint=settings.endpoint)
    raise ValueError(f"no object store for scheme '{scheme}'")


class ObjectStorage(Storage):
    """A :class:`Storage` over one fsspec file system. ``SCHEME://BUCKET/KEY`` is the
    file system's ``BUCKET/KEY``."""

    def __init__(self, *, scheme: str, fs: Any, endpoint: str) -> None:
        self.scheme = scheme
        self.fs = fs
        self.endpoint = endpoint
        self._buckets_seen: set[str] = set()

    def _key(self, path: str) -> str:
        prefix = f"{self.scheme}://"
        if not path.startswith(prefix):
            raise InputError(f"{path}: expected a {prefix} URI")
        key = path[len(prefix) :].strip("/")
        if not key:
            raise InputError(f"{path}: names no bucket ({prefix}BUCKET/KEY)")
        return key

    @contextlib.contextmanager
    def _errors(self, path: str) -> Iterator[None]:
        """Turns what the store answered into one line naming ``path``; a missing object
        stays a FileNotFoundError."""
        try:
            yield
        except FileNotFoundError as e:
            if _error_code(e) == "NoSuchBucket":
                raise self._no_bucket(path) from e
            raise
        except Exception as e:
            problem = _problem(e, self.endpoint)
            if problem is None:
                raise
            if problem.endswith(_DENIED):
                # A refused HEAD has no body to say why; the bucket's probe has one.
                self._check_bucket(path)
            raise InputError(f"{path}: {problem}") from e

    def _no_bucket(self, path: str) -> InputError:
        bucket = self._key(path).split("/", 1)[0]
        return InputError(f"{path}: bucket '{bucket}' does not exist at {self.endpoint}")

    def _check_bucket(self, path: str) -> None:
        """Raises InputError when ``path``'s bucket does not exist or the credentials are
        refused (asked once per bucket)."""
        bucket = self._key(path).split("/", 1)[0]
        if bucket in self._buckets_seen:
            return
        try:
            self._probe_bucket(bucket)
        except FileNotFoundError as e:
            raise self._no_bucket(path) from e
        except Exception as e:
            problem = _problem(e, self.endpoint)
            if problem is None:
                raise
            raise InputError(f"{path}: {problem}") from e
        self._buckets_seen.add(bucket)

    def _probe_bucket(self, bucket: str) -> None:
        """Raises FileNotFoundError when ``bucket`` does not exist; what the store answered
        otherwise."""
        self.fs.info(bucket)

    def open(self, path: str, mode: str = "rb") -> IO:
        if "r" not in mode:
            # A write fails only when the object is published, at close: find a missing
            # bucket or rejected credentials before anything is written.
            self._check_bucket(path)
        with self._errors(path):
            return self.fs.open(self._key(path), mode)

    def exists(self, path: str) -> bool:
        return self._found(path, self.fs.exists)

    def isdir(self, path: str) -> bool:
        return self._found(path, self.fs.isdir)

    def _found(self, path: str, ask: Callable[[str], bool]) -> bool:
        with self._errors(path):
            found = ask(self._key(path))
        if not found:
            # s3fs answers False for a missing bucket too; that is an error, not an absence.
            self._check_bucket(path)
        return found

    def makedirs(self, path: str) -> None:
        # There are no directories to make; a prefix exists once an object is under it.
        self._check_bucket(path)

    def listdir(self, path: str) -> list[str]:
        key = self._key(path)
        with self._errors(path):
            entries = self.fs.ls(key, detail=False, refresh=True)
        # A zero-byte "KEY/" marker object, which some tools make, is the prefix itself.
        children = (entry.rstrip("/") for entry in entries)
        return sorted({child.rpartition("/")[2] for child in children if child != key})

    def rename(self, src: str, dst: str) -> None:
        # A copy, then a delete: each object at ``dst`` is whole, but the move is not atomic.
        with self._errors(src):
            self.fs.mv(self._key(src), self._key(dst))

    def remove(self, path: str) -> None:
        with self._errors(path), contextlib.suppress(FileNotFoundError):
            self.fs.rm(self._key(path), recursive=True)

    def size(self, path: str) -> int:
        with self._errors(path):
            return int(self.fs.size(self._key(path)))

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        # One ranged GET (a Range header): the cost is the range, not the object.
        with self._errors(path):
            try:
                return self.fs.cat_file(self._key(path), start=offset, end=offset + length)
            except OSError as e:
                if _error_code(e) in ("InvalidRange", "416"):
                    return b""  # the object ends before ``offset``; the caller says so
                raise

    def write_atomic(self, path: str, data: bytes) -> None:
        # One PUT: the object appears whole when the upload completes, or not at all. No
        # temporary object and copy, which would only cost a second upload.
        self._check_bucket(path)
        with self._errors(path):
            self.fs.pipe_file(self._key(path), data)

    @contextlib.contextmanager
    def open_atomic(self, path: str) -> Iterator[IO[bytes]]:
        # An upload publishes the object only when it completes, so no temporary object.
        f = self.open(path, "wb")
        try:
            yield f
        except BaseException:
            f.discard()  # aborts a multipart upload; nothing is published
            f.closed = True  # else closing it, even at garbage collection, would publish
            raise
        with self._errors(path):
            f.close()

    def publish_directory(self, tmp: str, path: str) -> None:
        """Copies ``tmp``'s objects under ``path``, then removes ``tmp``.

        A prefix cannot be renamed, and its objects cannot be replaced all at once, so this
        is ordered for readers instead: the old objects are removed first (a reader never
        finds a mix of old and new), the objects in subdirectories are copied next, and the
        top-level ones last. A directory's top-level files are the ones that name the rest
        (``schema.json`` lists the data's shards, ``saved_model.pb`` refers to
        ``variables/``), so a reader that finds them finds everything they name. The data
        was written completely under ``tmp`` first, so a writer that fails never touches
        ``path``; a crash in the middle of the copies leaves ``path`` without its top-level
        files, which reads as missing, not as complete.
        """
        source, target = self._key(tmp), self._key(path)
        self.remove(path)
        with self._errors(tmp):
            keys = sorted(self.fs.find(source))
        relative = [key[len(source) + 1 :] for key in keys]
        nested = [r for r in relative if "/" in r]
        top = [r for r in relative if "/" not in r]
        with self._errors(path):
            for batch in (nested, top):
                if batch:
                    self.fs.copy([f"{source}/{r}" for r in batch], [f"{target}/{r}" for r in batch])
        self.remove(tmp)


class S3Storage(ObjectStorage):
    """An S3-compatible store (s3fs)."""

    def _probe_bucket(self, bucket: str) -> None:
        # A listing of at most one key, not HEAD: its error has a body with the reason
        # (NoSuchBucket, InvalidAccessKeyId, SignatureDoesNotMatch).
        self.fs.call_s3("list_objects_v2", Bucket=bucket, MaxKeys=1)


def _error_code(error: BaseException) -> str | None:
    """The store's error code (``NoSuchBucket``, ``403``) behind ``error``, if it has one."""
    seen: BaseException | None = error
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            return response.get("Error", {}).get("Code")
        code = getattr(seen, "code", None)  # gcsfs's HttpError
        if isinstance(code, int):
            return str(code)
        seen = seen.__cause__ or seen.__context__
    return None


def _problem(error: BaseException, endpoint: str) -> str | None:
    """What is wrong, in a few words, for errors that are about the configuration (the
    credentials, the endpoint); None for any other error."""
    code = _error_code(error)
    name = type(error).__name__
    if code in _CREDENTIAL_ERRORS:
        return f"{endpoint} {_CREDENTIAL_ERRORS[code]}"
    if code in ("AccessDenied", "401", "403") or isinstance(error, PermissionError):
        return f"{endpoint} {_DENIED}"
    if isinstance(error, OSError) and str(error).startswith("Forbidden"):  # gcsfs's 403
        return f"{endpoint} {_DENIED}"
    if name == "NoCredentialsError":
        return f"no credentials for {endpoint}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    if name in ("DefaultCredentialsError", "RefreshError"):
        return f"no usable Google credentials: {_one_line(error)}"
    if name in _UNREACHABLE:
        return f"{_UNREACHABLE[name]} the object store at {endpoint}"
    return None


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())
