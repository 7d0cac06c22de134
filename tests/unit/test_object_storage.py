"""Object storage through s3fs, against a real S3-compatible server (moto) that checks
credentials: file operations, ranged reads, atomic writes, TFRecord ranges, clear errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from elastic_step.data import storage
from elastic_step.data.object_storage import KFP_MINIO_ENDPOINT, S3Settings
from elastic_step.data.tfrecord import index_path, read_records, write_shard
from elastic_step.errors import InputError
from elastic_step.master.config import TrainConfig


@pytest.fixture
def bucket(s3_env) -> str:
    return s3_env.new_bucket()


@pytest.mark.parametrize("scheme", ["s3", "minio"])
def test_file_operations(s3_env, bucket, scheme):
    root = f"{scheme}://{bucket}/run"
    storage.makedirs(root)  # a prefix needs no making; the bucket exists
    storage.write_text_atomic(f"{root}/b.txt", "bee")
    storage.write_bytes_atomic(f"{root}/sub/a.bin", bytes(range(256)))
    with storage.open_file(f"{root}/sub/c.txt", "w") as f:
        f.write("sea")

    assert storage.read_text(f"{root}/b.txt") == "bee"
    assert storage.read_text(f"{root}/sub/c.txt") == "sea"
    assert storage.size(f"{root}/sub/a.bin") == 256
    assert storage.read_range(f"{root}/sub/a.bin", 250, 6) == bytes(range(250, 256))
    assert storage.listdir(root) == ["b.txt", "sub"]
    assert storage.listdir(f"{root}/sub") == ["a.bin", "c.txt"]
    assert storage.exists(f"{root}/sub") and storage.isdir(f"{root}/sub")
    assert storage.exists(f"{root}/b.txt") and not storage.isdir(f"{root}/b.txt")
    assert not storage.exists(f"{root}/nothing")
    with pytest.raises(InputError, match="file ends early"):
        storage.read_range(f"{root}/sub/a.bin", 250, 7)
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(f"{root}/nothing")

    storage.storage_for(root).rename(f"{root}/b.txt", f"{root}/sub/b.txt")
    storage.remove(f"{root}/sub/a.bin")
    storage.remove(f"{root}/never-written")  # no error for an absent path
    assert s3_env.keys(bucket) == ["run/sub/b.txt", "run/sub/c.txt"]
    storage.remove(root)
    assert s3_env.keys(bucket) == []


def test_fetch_copies_a_file_or_a_tree_to_local_disk(s3_env, bucket, tmp_path):
    # What the master uploads to MLflow from an object-store --output.
    root = f"s3://{bucket}/run"
    storage.write_text_atomic(f"{root}/summary.json", "{}")
    storage.write_bytes_atomic(f"{root}/saved_model/saved_model.pb", b"pb")
    storage.write_bytes_atomic(f"{root}/saved_model/variables/variables.index", b"ix")

    assert Path(storage.fetch(f"{root}/summary.json", str(tmp_path))).read_text() == "{}"
    copy = storage.fetch(f"{root}/saved_model", str(tmp_path))
    assert copy == str(tmp_path / "saved_model")
    files = sorted(
        os.path.relpath(os.path.join(d, f), copy) for d, _, names in os.walk(copy) for f in names
    )
    assert files == ["saved_model.pb", "variables/variables.index"]
    assert (Path(copy) / "variables" / "variables.index").read_bytes() == b"ix"
    local = tmp_path / "local.txt"
    local.write_text("here")
    assert storage.fetch(str(local), "/nonexistent") == str(local)  # a local path: itself


def test_read_range_is_one_ranged_get(s3_env, bucket):
    path = f"s3://{bucket}/big.bin"
    storage.write_bytes_atomic(path, bytes(1 << 20))
    store = storage.storage_for(path)
    requests = []

    def record(params, **_):
        requests.append(params["headers"].get("Range"))

    store.fs.s3.meta.events.register("before-call.s3.GetObject", record)
    try:
        assert storage.read_range(path, 1000, 24) == bytes(24)
    finally:
        store.fs.s3.meta.events.unregister("before-call.s3.GetObject", record)
    assert requests == ["bytes=1000-1023"]


def test_atomic_writes_leave_no_temporaries(s3_env, bucket):
    path = f"s3://{bucket}/out/summary.json"
    storage.write_text_atomic(path, "one")
    storage.write_text_atomic(path, "two")
    assert storage.read_text(path) == "two"
    assert s3_env.keys(bucket) == ["out/summary.json"]


def test_a_streamed_atomic_write_publishes_whole_or_not_at_all(s3_env, bucket):
    path = f"s3://{bucket}/out/predictions.csv"
    chunk = b"x" * (3 * 2**20)
    # Over s3fs's 5 MiB block: a multipart upload, published when it completes.
    with storage.open_atomic(path) as f:
        for _ in range(3):
            f.write(chunk)
    assert storage.size(path) == 3 * len(chunk)
    with pytest.raises(RuntimeError, match="merge failed"), storage.open_atomic(path) as f:
        for _ in range(3):
            f.write(b"y" * len(chunk))
        raise RuntimeError("merge failed")
    assert storage.read_range(path, 0, 4) == b"xxxx"  # the old object, untouched
    assert s3_env.keys(bucket) == ["out/predictions.csv"]


def test_atomic_directory_replaces_the_old_one_whole(s3_env, bucket):
    data = f"s3://{bucket}/data"
    with storage.atomic_directory(data) as tmp:
        storage.write_text_atomic(f"{tmp}/schema.json", "old")
        storage.write_text_atomic(f"{tmp}/train/stale.bin", "x")

    with pytest.raises(RuntimeError), storage.atomic_directory(data) as tmp:
        storage.write_text_atomic(f"{tmp}/schema.json", "half")
        raise RuntimeError("the writer fails")
    assert s3_env.keys(bucket) == ["data/schema.json", "data/train/stale.bin"]
    assert storage.read_text(f"{data}/schema.json") == "old"

    copied = []

    def record(params, **_):
        copied.append(params["Key"])

    client = storage.storage_for(data).fs.s3
    client.meta.events.register("provide-client-params.s3.CopyObject", record)
    try:
        with storage.atomic_directory(data) as tmp:
            storage.write_text_atomic(f"{tmp}/schema.json", "new")
            storage.write_text_atomic(f"{tmp}/train/shard-0", "0")
            storage.write_text_atomic(f"{tmp}/train/shard-1", "1")
    finally:
        client.meta.events.unregister("provide-client-params.s3.CopyObject", record)
    assert s3_env.keys(bucket) == ["data/schema.json", "data/train/shard-0", "data/train/shard-1"]
    assert storage.read_text(f"{data}/schema.json") == "new"
    # The file that names the others is published last.
    assert sorted(copied[:2]) == ["data/train/shard-0", "data/train/shard-1"]
    assert copied[2:] == ["data/schema.json"]


def test_worker_reads_a_task_range_from_shards_on_s3(s3_env, bucket):
    records = [f"record {i} ".encode() * (i + 1) for i in range(20)]
    shard = f"s3://{bucket}/data/train/shard-00000"
    assert write_shard(shard, records) == 20
    assert s3_env.keys(bucket) == ["data/train/shard-00000", "data/train/shard-00000.index"]
    assert read_records(shard, 5, 12) == records[5:12]

    # Flip one byte of record 7's data: the range read checks every record's checksums.
    raw = bytearray(storage.read_bytes(shard))
    offset = int.from_bytes(storage.read_range(index_path(shard), 7 * 8, 8), "little")
    raw[offset + 12] ^= 0xFF
    storage.write_bytes_atomic(shard, bytes(raw))
    assert read_records(shard, 0, 7) == records[:7]
    with pytest.raises(InputError, match=r"shard-00000: record 7 is corrupt: bad data checksum"):
        read_records(shard, 5, 12)


def test_rejected_access_key_id(s3_env, bucket, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOTAKNOWNKEY0000")
    # A read (whose refused HEAD says nothing) and a write both name what was rejected.
    for path, call in (
        (f"s3://{bucket}/x.csv", storage.read_bytes),
        (f"s3://{bucket}/y/z.json", lambda p: storage.write_text_atomic(p, "{}")),
    ):
        with pytest.raises(InputError) as e:
            call(path)
        assert str(e.value) == (
            f"{path}: {s3_env.endpoint} rejected the access key id (AWS_ACCESS_KEY_ID)"
        )


def test_rejected_secret_access_key(s3_env, bucket, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(InputError) as e:
        storage.listdir(f"minio://{bucket}/run")
    assert str(e.value) == (
        f"minio://{bucket}/run: {s3_env.endpoint} rejected the secret access key "
        "(AWS_SECRET_ACCESS_KEY)"
    )


def test_missing_bucket(s3_env):
    for call in (
        lambda: storage.read_bytes("s3://no-such-bucket/data/schema.json"),
        lambda: storage.exists("s3://no-such-bucket/data/schema.json"),
        lambda: storage.write_text_atomic("s3://no-such-bucket/data/schema.json", "{}"),
    ):
        with pytest.raises(InputError) as e:
            call()
        assert str(e.value) == (
            "s3://no-such-bucket/data/schema.json: bucket 'no-such-bucket' does not exist "
            f"at {s3_env.endpoint}"
        )


def test_unreachable_endpoint(s3_env, monkeypatch):
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    with pytest.raises(InputError) as e:
        storage.read_bytes("minio://mlpipeline/x.csv")
    assert (
        str(e.value) == f"minio://mlpipeline/x.csv: cannot connect to the object store at {closed}"
    )


def test_endpoint_and_region_from_the_environment():
    assert S3Settings.from_env("minio", {}).endpoint_url == KFP_MINIO_ENDPOINT
    assert S3Settings.from_env("s3", {}).endpoint_url is None  # AWS itself
    env = {"AWS_ENDPOINT_URL": "http://a:9000", "AWS_DEFAULT_REGION": "eu-west-1"}
    assert S3Settings.from_env("minio", env) == S3Settings(
        endpoint_url="http://a:9000", region="eu-west-1"
    )
    env |= {"AWS_ENDPOINT_URL_S3": "http://b:9000", "AWS_REGION": "eu-north-1"}
    assert S3Settings.from_env("s3", env) == S3Settings(
        endpoint_url="http://b:9000", region="eu-north-1"
    )


def _status(path: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "elastic_step", "status", path],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_gives_one_line_and_exit_2(s3_env, bucket, monkeypatch):
    result = _status("s3://no-such-bucket/run")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "elastic-step: error: s3://no-such-bucket/run/status.json: bucket 'no-such-bucket' "
        f"does not exist at {s3_env.endpoint}"
    ]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    result = _status(f"s3://{bucket}/run")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"elastic-step: error: s3://{bucket}/run/status.json: {s3_env.endpoint} rejected the "
        "secret access key (AWS_SECRET_ACCESS_KEY)"
    ]


def test_the_master_state_stays_on_local_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    remote = TrainConfig(model_def="m.py", data="s3://b/data", output="s3://b/run")
    # Named after the job, whose default name comes from --output: a re-run finds it.
    assert remote.local_dir == str(tmp_path / "xdg" / "elastic-step" / remote.resolved_job_name)
    local = TrainConfig(model_def="m.py", data="s3://b/data", output=str(tmp_path / "run"))
    assert local.local_dir == str(tmp_path / "run")
    chosen = TrainConfig(model_def="m.py", data="d", output="s3://b/run", state_dir="st")
    assert chosen.local_dir == os.path.abspath("st")

    with pytest.raises(InputError) as e:
        TrainConfig(model_def="m.py", data="d", output="s3://b/run", state_dir="s3://b/state")
    assert str(e.value) == (
        "--state-dir must be a local directory (the master's state needs flock, fsync and "
        "atomic rename), got 's3://b/state'"
    )
    with pytest.raises(InputError) as e:
        TrainConfig(
            model_def="m.py", data="d", output="s3://b/run", backend="kubernetes", state_dir="st"
        )
    assert str(e.value) == (
        "--state-dir applies to --backend local only (on Kubernetes the master keeps its "
        "state on the cluster), got 'st'"
    )


def test_a_checkpoint_streams_to_an_object_and_back(s3_env, bucket):
    """A PS checkpoint in a bucket: written through an upload that cannot seek, read back
    array by array from the object."""
    import numpy as np

    from elastic_step.ps import checkpoint

    arrays = {"table/t": np.arange(300_000, dtype=np.float32).reshape(-1, 3), "dense/b": np.ones(4)}
    directory = f"s3://{bucket}/run/checkpoints/ps-0-of-1"
    checkpoint.save(directory, 7, arrays, keep=2, token=1)
    version, loaded = checkpoint.load_latest(directory)
    assert version == 7 and set(loaded) == set(arrays)
    assert all(np.array_equal(loaded[k], v) for k, v in arrays.items())
