"""Parameter servers: placement, the client over real gRPC shards, error classes, restore
rules, checkpoints (and the final one on SIGTERM), staleness."""

from __future__ import annotations

import errno
import io
import logging
import os
import queue
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import keras
import numpy as np
import pytest
from model_defs import linear_regression

from elastic_step.master.instances.job_keys import JobKeys
from elastic_step.output_layout import OutputLayout
from elastic_step.ps import checkpoint
from elastic_step.ps.server import (
    ParameterServerServicer,
    RestorePolicy,
    modulates_staleness,
    shut_down,
)
from elastic_step.ps.server import main as ps_main
from elastic_step.ps.shard import ParameterShard, TableShape
from elastic_step.rpc import auth, master_pb2, master_pb2_grpc, placement, ps_pb2_grpc
from elastic_step.rpc.auth import AuthInterceptor, Credentials
from elastic_step.rpc.ps_client import PSClient, PSError, PSUnavailableError, TableSpec
from elastic_step.rpc.tokens import TokenSigner

LR = 0.1
# With 2 shards, crc32 puts "dense/kernel" on shard 1 and "dense_1/bias" on shard 0.
KERNEL, BIAS, TABLE = "dense/kernel", "dense_1/bias", "emb/embeddings"
TABLE_ROWS, TABLE_DIM = 7, 3
SECRET = auth.new_secret()
VERIFY_KEY = TokenSigner(SECRET).verify_key
WORKER = Credentials.for_instance(SECRET, "worker-0")


#: The table's initial values: what the model's initializers give the PS (``initial_table``).
INITIAL = {
    TABLE: np.arange(TABLE_ROWS * TABLE_DIM, dtype=np.float32).reshape(TABLE_ROWS, TABLE_DIM)
}


def _initial_table(name: str, shape: TableShape) -> np.ndarray:
    assert (shape.rows, shape.dim) == INITIAL[name].shape
    return INITIAL[name]


def _params() -> tuple[dict[str, np.ndarray], dict[str, TableSpec], dict]:
    """What a fresh worker offers: its dense values and the tables' shapes, no rows."""
    dense = {
        KERNEL: np.arange(6, dtype=np.float32).reshape(3, 2) / 10,
        BIAS: np.array([1.0, -1.0], np.float32),
    }
    return dense, {TABLE: TableSpec(TABLE_ROWS, TABLE_DIM, "float32")}, {}


@dataclass
class Cluster:
    servicers: list[ParameterServerServicer]
    servers: list[grpc.Server]
    addresses: list[str]
    clients: list[PSClient] = field(default_factory=list)

    def client(self, timeout_s: float = 10.0, credentials: Credentials = WORKER) -> PSClient:
        client = PSClient(self.addresses, credentials, timeout_s=timeout_s)
        self.clients.append(client)
        return client

    def initialized_client(self) -> PSClient:
        """A client that has offered a fresh worker's values (``_params()``) at version 0."""
        client = self.client()
        client.initialize(*_params(), model_version=0)
        return client

    def shard(self, i: int) -> ParameterShard:
        shard = self.servicers[i].shard
        assert shard is not None
        return shard


StartCluster = Callable[..., Cluster]


@pytest.fixture
def start_cluster(tmp_path: Path) -> Iterator[StartCluster]:
    """``start_cluster(num_ps=2, optimizer=SGD, ...)`` starts real in-process gRPC PS shards."""
    clusters: list[Cluster] = []

    def start(
        num_ps: int = 2,
        optimizer: Callable[[], keras.optimizers.Optimizer] = lambda: keras.optimizers.SGD(LR),
        checkpoint_steps: int = 0,
        keep_checkpoints: int = 3,
        staleness_modulation: bool = False,
        job_model_version: int = 0,
        servicer_class: type[ParameterServerServicer] = ParameterServerServicer,
    ) -> Cluster:
        cluster = Cluster([], [], [])
        clusters.append(cluster)
        for i in range(num_ps):
            servicer = servicer_class(RestorePolicy(job_model_version))
            servicer.settings = master_pb2.JobSettings(
                output_dir=str(tmp_path),
                checkpoint_steps=checkpoint_steps,
                keep_checkpoints=keep_checkpoints,
                num_ps=num_ps,
            )
            servicer.shard = ParameterShard(
                i, num_ps, optimizer(), staleness_modulation, _initial_table
            )
            server = grpc.server(
                futures.ThreadPoolExecutor(4), interceptors=[AuthInterceptor(VERIFY_KEY)]
            )
            ps_pb2_grpc.add_ParameterServerServicer_to_server(servicer, server)
            port = server.add_insecure_port("127.0.0.1:0")
            server.start()
            cluster.servicers.append(servicer)
            cluster.servers.append(server)
            cluster.addresses.append(f"127.0.0.1:{port}")
        return cluster

    yield start
    for cluster in clusters:
        for client in cluster.clients:
            client.close()
        for server in cluster.servers:
            server.stop(None).wait()


@pytest.fixture
def cluster(start_cluster: StartCluster) -> Cluster:
    return start_cluster()


@pytest.fixture
def ps(cluster: Cluster) -> PSClient:
    """A client over two initialized SGD shards."""
    client = cluster.client()
    assert client.initialize(*_params(), model_version=0) == [True, True]
    return client


# -- placement --


def test_shard_of_variable_is_crc32_and_stable() -> None:
    # Fixed values: a per-process hash() would change them from run to run.
    assert placement.shard_of_variable("dense/kernel", 3) == 0
    assert placement.shard_of_variable("dense/bias", 3) == 1
    assert placement.shard_of_variable("dense_1/bias", 3) == 2
    assert placement.shard_of_variable(KERNEL, 2) == 1
    assert placement.shard_of_variable(BIAS, 2) == 0
    for name in ["a", "layer/kernel", "ü/x"]:
        for n in (1, 2, 5):
            assert placement.shard_of_variable(name, n) == zlib.crc32(name.encode()) % n
    assert placement.shard_of_variable("anything", 1) == 0


def test_shard_of_variable_spreads_names() -> None:
    counts = Counter(placement.shard_of_variable(f"layer_{i}/kernel", 4) for i in range(200))
    assert set(counts) == {0, 1, 2, 3}
    assert min(counts.values()) >= 30


def test_rows_by_id_modulo() -> None:
    ids = np.array([0, 1, 2, 3, 7, 10], np.int64)
    np.testing.assert_array_equal(placement.shard_of_rows(ids, 3), [0, 1, 2, 0, 1, 1])
    np.testing.assert_array_equal(placement.local_rows(ids, 3), [0, 0, 0, 1, 2, 3])
    assert [placement.rows_owned(10, s, 3) for s in range(3)] == [4, 3, 3]
    assert [placement.rows_owned(7, s, 2) for s in range(2)] == [4, 3]
    assert [placement.rows_owned(1, s, 2) for s in range(2)] == [1, 0]
    # Every row's local index is inside its owner's part of the table.
    all_ids = np.arange(10)
    for shard in range(3):
        local = placement.local_rows(all_ids[placement.shard_of_rows(all_ids, 3) == shard], 3)
        np.testing.assert_array_equal(local, np.arange(placement.rows_owned(10, shard, 3)))


# -- the client over real shards --


def test_initialize_places_dense_by_hash_and_rows_by_id(cluster: Cluster) -> None:
    client = cluster.client()
    dense, tables, _ = _params()
    table_values = INITIAL
    assert client.initialize(dense, tables, {}, model_version=0) == [True, True]
    s0, s1 = cluster.shard(0), cluster.shard(1)
    assert set(s0._dense) == {BIAS}
    assert set(s1._dense) == {KERNEL}
    np.testing.assert_array_equal(s0.pull({}, True)[:2][1][BIAS], dense[BIAS])
    np.testing.assert_array_equal(s1.pull({}, True)[:2][1][KERNEL], dense[KERNEL])
    # Shard s holds rows s, s + 2, s + 4, ... in that order, from the model's initializers.
    np.testing.assert_array_equal(s0.tables[TABLE].values, table_values[TABLE][0::2])
    np.testing.assert_array_equal(s1.tables[TABLE].values, table_values[TABLE][1::2])
    assert s0.tables[TABLE].shape == TableShape(TABLE_ROWS, TABLE_DIM, "float32")


def test_initialize_takes_the_rows_a_worker_pulled(cluster: Cluster) -> None:
    dense, tables, _ = _params()
    pulled = {TABLE: (np.array([5, 2]), np.full((2, TABLE_DIM), -1, np.float32))}
    assert cluster.client().initialize(dense, tables, pulled, model_version=3) == [True, True]
    expected = INITIAL[TABLE].copy()
    expected[[5, 2]] = -1
    np.testing.assert_array_equal(cluster.shard(0).tables[TABLE].values, expected[0::2])
    np.testing.assert_array_equal(cluster.shard(1).tables[TABLE].values, expected[1::2])


def test_second_initialize_is_refused_and_keeps_values(ps: PSClient, cluster: Cluster) -> None:
    dense, tables, _ = _params()
    table_values = INITIAL
    other_dense = {n: v + 100 for n, v in dense.items()}
    other_rows = {TABLE: (np.arange(TABLE_ROWS), table_values[TABLE] + 100)}
    assert ps.initialize(other_dense, tables, other_rows, model_version=5) == [False, False]
    pulled = ps.pull()[0]
    for name, value in dense.items():
        np.testing.assert_array_equal(pulled[name], value)
    np.testing.assert_array_equal(
        ps.pull({TABLE: np.arange(TABLE_ROWS)}, dense=False)[1][TABLE], table_values[TABLE]
    )
    assert [cluster.shard(i).version for i in range(2)] == [0, 0]


def test_pull_dense_joins_all_shards(ps: PSClient) -> None:
    dense, _, _ = _params()
    pulled = ps.pull()[0]
    assert set(pulled) == {KERNEL, BIAS}
    for name, value in dense.items():
        np.testing.assert_array_equal(pulled[name], value)
        assert pulled[name].dtype == np.float32
    assert ps.versions == [0, 0]


def test_pull_rows_in_requested_order_across_shards(ps: PSClient) -> None:
    _, _, _ = _params()
    table_values = INITIAL
    ids = np.array([5, 0, 3, 3, 6, 1, 2])
    np.testing.assert_array_equal(
        ps.pull({TABLE: ids}, dense=False)[1][TABLE], table_values[TABLE][ids]
    )


def test_pull_rows_all_on_one_shard(ps: PSClient) -> None:
    _, _, _ = _params()
    table_values = INITIAL
    ids = np.array([4, 0, 2])  # all even: shard 1 is asked for no rows
    np.testing.assert_array_equal(
        ps.pull({TABLE: ids}, dense=False)[1][TABLE], table_values[TABLE][ids]
    )


def test_push_applies_sgd_exactly(ps: PSClient) -> None:
    dense, _, _ = _params()
    table_values = INITIAL
    kernel_grad = np.full((3, 2), 0.5, np.float32)
    bias_grad = np.array([2.0, -4.0], np.float32)
    row_ids = np.array([1, 4], np.int64)  # one row on each shard
    row_grad = np.array([[1.0, 2.0, 3.0], [-1.0, 0.0, 10.0]], np.float32)

    new_dense, new_rows = ps.push(
        {KERNEL: kernel_grad, BIAS: bias_grad},
        {TABLE: (row_ids, row_grad)},
        pull_ids={TABLE: np.array([4, 0, 1])},
    )

    expected_kernel = dense[KERNEL] - LR * kernel_grad
    expected_bias = dense[BIAS] - LR * bias_grad
    np.testing.assert_allclose(new_dense[KERNEL], expected_kernel, rtol=1e-6)
    np.testing.assert_allclose(new_dense[BIAS], expected_bias, rtol=1e-6)
    expected_table = table_values[TABLE].copy()
    expected_table[row_ids] -= LR * row_grad
    # The pull after the update: the rows asked for, in the order asked.
    np.testing.assert_allclose(new_rows[TABLE], expected_table[[4, 0, 1]], rtol=1e-6)
    # The shards hold the new values; rows that got no gradient are unchanged.
    pulled = ps.pull()[0]
    np.testing.assert_allclose(pulled[KERNEL], expected_kernel, rtol=1e-6)
    np.testing.assert_allclose(pulled[BIAS], expected_bias, rtol=1e-6)
    table = ps.pull({TABLE: np.arange(TABLE_ROWS)}, dense=False)[1][TABLE]
    np.testing.assert_allclose(table, expected_table, rtol=1e-6)
    untouched = [0, 2, 3, 5, 6]
    np.testing.assert_array_equal(table[untouched], table_values[TABLE][untouched])
    assert ps.versions == [1, 1]


def test_push_advances_every_shard_even_without_its_gradients(
    ps: PSClient, cluster: Cluster
) -> None:
    dense, _, _ = _params()
    table_values = INITIAL
    # Only shard 1 (the kernel's, and odd row 3's) gets gradients.
    grad = np.ones((3, 2), np.float32)
    new_dense, new_rows = ps.push(
        {KERNEL: grad}, {TABLE: (np.array([3]), np.ones((1, 3)))}, pull_ids={TABLE: [3]}
    )
    assert [cluster.shard(i).version for i in range(2)] == [1, 1]
    assert ps.versions == [1, 1]
    assert ps.model_version == 1
    np.testing.assert_array_equal(new_dense[BIAS], dense[BIAS])  # every shard's values come back
    np.testing.assert_allclose(new_dense[KERNEL], dense[KERNEL] - LR, rtol=1e-6)
    np.testing.assert_allclose(new_rows[TABLE], INITIAL[TABLE][[3]] - LR, rtol=1e-6)
    ps.push({}, {})
    assert [cluster.shard(i).version for i in range(2)] == [2, 2]
    np.testing.assert_array_equal(ps.pull()[0][BIAS], dense[BIAS])
    np.testing.assert_array_equal(
        ps.pull({TABLE: [0, 1, 2]}, dense=False)[1][TABLE], table_values[TABLE][[0, 1, 2]]
    )


def test_push_without_a_pull(ps: PSClient) -> None:
    dense, _, _ = _params()
    assert ps.push({BIAS: np.ones(2, np.float32)}, {}, pull_dense=False) == ({}, {})
    np.testing.assert_allclose(ps.pull()[0][BIAS], dense[BIAS] - LR, rtol=1e-6)


def test_uninitialized_shard_is_unavailable(cluster: Cluster) -> None:
    dense, tables, _ = _params()
    client = cluster.client()
    with pytest.raises(PSUnavailableError, match="holds no parameters") as e:
        client.pull()[0]
    assert e.value.shard == 0
    with pytest.raises(PSUnavailableError, match="UNAVAILABLE: PS shard 0 holds no parameters"):
        client.push({BIAS: np.ones(2, np.float32)}, {})
    with pytest.raises(PSUnavailableError, match="holds no parameters"):
        client.pull({TABLE: np.array([0, 1])}, dense=False)
    assert client.initialized() == [False, False]
    # Only shard 0 filled (as after shard 1 was relaunched without a checkpoint).
    shard0_dense = {n: v for n, v in dense.items() if placement.shard_of_variable(n, 2) == 0}
    shapes = {n: TableShape(t.rows, t.dim, t.dtype) for n, t in tables.items()}
    assert cluster.shard(0).initialize(shard0_dense, shapes, {}, 0)
    assert client.initialized() == [True, False]
    with pytest.raises(PSUnavailableError, match="holds no parameters") as e:
        client.pull()[0]
    assert e.value.shard == 1
    with pytest.raises(PSUnavailableError, match="holds no parameters") as e:
        client.push({BIAS: np.ones(2, np.float32)}, {})
    assert e.value.shard == 1


def test_starting_ps_is_unavailable(cluster: Cluster) -> None:
    cluster.servicers[1].shard = None
    with pytest.raises(PSUnavailableError, match="UNAVAILABLE") as e:
        cluster.client().pull()[0]
    assert e.value.shard == 1


def test_stopped_server_is_unavailable(ps: PSClient, cluster: Cluster) -> None:
    cluster.servers[0].stop(None).wait()
    with pytest.raises(PSUnavailableError, match="UNAVAILABLE") as e:
        ps.pull()[0]
    assert e.value.shard == 0
    with pytest.raises(PSUnavailableError) as e:
        ps.push({KERNEL: np.ones((3, 2), np.float32)}, {})
    assert e.value.shard == 0


class _RejectingServicer(ParameterServerServicer):
    """A shard that turns pushes down as a PS with a bug, or a bad request, would."""

    def Push(self, request, context):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "gradient for unknown variable 'x'")


class _SlowServicer(ParameterServerServicer):
    def Pull(self, request, context):
        time.sleep(1.0)
        return super().Pull(request, context)


def test_other_statuses_are_ps_errors_not_unavailable(start_cluster: StartCluster) -> None:
    client = start_cluster(servicer_class=_RejectingServicer).initialized_client()
    with pytest.raises(PSError) as e:
        client.push({BIAS: np.ones(2, np.float32)}, {})
    assert not isinstance(e.value, PSUnavailableError)
    assert str(e.value) == (
        "PS shard 0 rejected Push: INVALID_ARGUMENT: gradient for unknown variable 'x'"
    )
    assert (e.value.shard, e.value.code) == (0, grpc.StatusCode.INVALID_ARGUMENT)


def test_refused_credentials_are_ps_errors(cluster: Cluster) -> None:
    stranger = Credentials.for_instance(auth.new_secret(), "worker-0")
    with pytest.raises(PSError, match=r"^PS shard 0 rejected Pull: UNAUTHENTICATED"):
        cluster.client(credentials=stranger).pull()[0]


def test_deadline_exceeded_is_unavailable(start_cluster: StartCluster) -> None:
    cluster = start_cluster(servicer_class=_SlowServicer)
    cluster.initialized_client()
    with pytest.raises(PSUnavailableError, match="DEADLINE_EXCEEDED"):
        cluster.client(timeout_s=0.2).pull()[0]


# -- where a (re)started shard gets its parameters --


def _offset_params(offset: float) -> tuple:
    """What a worker that has pulled every row offers, its values shifted by ``offset``."""
    dense, tables, _ = _params()
    return (
        {n: v + offset for n, v in dense.items()},
        tables,
        {n: (np.arange(len(v)), v + offset) for n, v in INITIAL.items()},
    )


def test_job_start_takes_the_first_initialize(start_cluster: StartCluster) -> None:
    cluster = start_cluster(job_model_version=0)
    first, second = cluster.client(), cluster.client()
    assert first.initialize(*_params(), model_version=0) == [True, True]
    assert second.initialize(*_offset_params(100), model_version=0) == [False, False]
    np.testing.assert_array_equal(second.pull()[0][BIAS], _params()[0][BIAS])


def test_mid_job_a_fresh_workers_values_are_refused(
    start_cluster: StartCluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = start_cluster(job_model_version=42)
    fresh = cluster.client()
    pulled = cluster.client(credentials=Credentials.for_instance(SECRET, "worker-1"))
    caplog.set_level(logging.WARNING, logger="elastic_step.ps")
    for _ in range(3):  # fresh workers keep offering while they wait
        assert fresh.initialize(*_params(), model_version=0) == [False, False]
    assert not cluster.shard(0).initialized and not cluster.shard(1).initialized
    refusals = [r for r in caplog.records if "refuses a fresh worker" in r.getMessage()]
    assert len(refusals) == 2  # once per shard, not once per offer
    with pytest.raises(PSUnavailableError, match="holds no parameters"):
        fresh.pull()[0]

    # A worker that has pulled version 40 fills the shards, at its version.
    assert pulled.initialize(*_offset_params(100), model_version=40) == [True, True]
    assert [cluster.shard(i).version for i in range(2)] == [40, 40]
    values = fresh.pull()[0]
    np.testing.assert_array_equal(values[BIAS], _params()[0][BIAS] + 100)
    assert fresh.versions == [40, 40]


def test_a_checkpoint_comes_before_any_worker(start_cluster: StartCluster) -> None:
    cluster = start_cluster(num_ps=1, job_model_version=42)
    directory = _ckpt_dir(cluster, 0)
    policy = cluster.servicers[0].policy
    assert policy.restore(ParameterShard(0, 1, keras.optimizers.SGD(LR)), directory) is None

    trained = ParameterShard(0, 1, keras.optimizers.SGD(LR), initial_table=_initial_table)
    dense, tables, _ = _params()
    table_values = INITIAL
    rows = {TABLE: (np.arange(TABLE_ROWS), table_values[TABLE])}
    shapes = {n: TableShape(t.rows, t.dim, t.dtype) for n, t in tables.items()}
    assert trained.initialize(dense, shapes, rows, 30)
    trained.push({BIAS: np.ones(2, np.float32)}, {}, 30)
    checkpoint.save(directory, *trained.state_arrays(), keep=2, token=1)

    assert policy.restore(cluster.shard(0), directory) == 31
    client = cluster.client()
    assert client.initialize(*_offset_params(100), model_version=40) == [False]
    np.testing.assert_allclose(client.pull()[0][BIAS], dense[BIAS] - LR, rtol=1e-6)
    assert client.versions == [31]


def test_restore_policy_rules() -> None:
    assert RestorePolicy(0).accepts(0) and RestorePolicy(0).accepts(5)
    assert not RestorePolicy(7).accepts(0)
    assert RestorePolicy(7).accepts(1) and RestorePolicy(7).accepts(9)


# -- checkpoints --


def _ckpt_dir(cluster: Cluster, shard: int) -> str:
    settings = cluster.servicers[shard].settings
    assert settings is not None
    return OutputLayout(settings.output_dir).checkpoint_dir(shard, settings.num_ps)


def test_servicer_checkpoints_every_n_versions_and_keeps_newest(
    start_cluster: StartCluster, tmp_path: Path
) -> None:
    cluster = start_cluster(checkpoint_steps=2, keep_checkpoints=2)
    client = cluster.initialized_client()
    client.push({}, {})
    assert not (tmp_path / "checkpoints").exists()  # version 1: no checkpoint yet
    client.push({}, {})
    for shard in range(2):
        directory = tmp_path / "checkpoints" / f"ps-{shard}-of-2"
        assert _ckpt_dir(cluster, shard) == str(directory)
        assert os.listdir(directory) == ["version-000000000002-t0.npz"]
    for _ in range(5):  # versions 3..7: checkpoints at 4 and 6
        client.push({}, {})
    for shard in range(2):
        names = sorted(os.listdir(tmp_path / "checkpoints" / f"ps-{shard}-of-2"))
        assert names == ["version-000000000004-t0.npz", "version-000000000006-t0.npz"]
        assert checkpoint.load_latest(_ckpt_dir(cluster, shard))[0] == 6


def test_a_checkpoint_that_cannot_be_written_fails_no_push_and_a_full_disk_ends_the_job(
    start_cluster: StartCluster, monkeypatch, caplog
) -> None:
    """An error that may pass is tried again at the next checkpoint; a full disk is a
    failure the PS tells the master at once (a real full disk:
    tests/e2e/test_hostile_conditions.py)."""
    cluster = start_cluster(num_ps=1, checkpoint_steps=1)
    client = cluster.initialized_client()
    servicer = cluster.servicers[0]
    errors = [OSError(errno.EIO, "Input/output error"), None, OSError(errno.ENOSPC, "x")]
    real_save = checkpoint.save

    def save(*args, **kwargs):
        error = errors.pop(0) if errors else None
        if error is not None:
            raise error
        return real_save(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "save", save)
    with caplog.at_level(logging.WARNING):
        client.push({}, {})  # EIO: the push is answered, the checkpoint tried again later
        assert servicer.failure == "" and not servicer.report_now.is_set()
        client.push({}, {})  # written
        assert servicer.saved_version == 2
        client.push({}, {})  # the disk is full
    assert client.model_version == 3  # every push was applied and answered
    assert servicer.failure == (
        f"cannot write a checkpoint in {_ckpt_dir(cluster, 0)}: no space left on device"
    )
    assert servicer.report_now.is_set()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].endswith("input/output error; trying again at the next checkpoint")
    assert lines[1] == servicer.failure and len(lines) == 2


def test_checkpoint_errors_that_may_pass_end_the_job_after_three_in_a_row(
    start_cluster: StartCluster, monkeypatch
) -> None:
    cluster = start_cluster(num_ps=1, checkpoint_steps=1)
    client = cluster.initialized_client()

    def save(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(checkpoint, "save", save)
    for pushes in range(1, 4):
        assert cluster.servicers[0].failure == "", pushes
        client.push({}, {})
    assert cluster.servicers[0].failure.endswith(": input/output error")


def test_no_checkpoints_when_steps_is_zero(start_cluster: StartCluster, tmp_path: Path) -> None:
    cluster = start_cluster(checkpoint_steps=0)
    client = cluster.initialized_client()
    for _ in range(3):
        client.push({}, {})
    assert not (tmp_path / "checkpoints").exists()


def _adam_push(shard: ParameterShard, step: int) -> tuple[int, dict, dict]:
    """The same gradients for the same step, whichever shard gets them."""
    rng = np.random.default_rng(step)
    dense = {
        n: rng.normal(size=v.shape).astype(np.float32)
        for n, v in _params()[0].items()
        if n in shard._dense
    }
    # One row updated before (1 or 2) and one never (0 or 3), on each shard.
    ids = np.arange(shard.shard, TABLE_ROWS, shard.num_ps)[:2]
    rows = {TABLE: (ids, rng.normal(size=(len(ids), TABLE_DIM)).astype(np.float32))}
    return shard.push(dense, rows, shard.version, pull=({TABLE: ids}, True))


def test_checkpoint_restores_values_version_and_per_row_optimizer_state(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(optimizer=lambda: keras.optimizers.Adam(0.01), checkpoint_steps=3)
    client = cluster.initialized_client()
    for step in range(3):
        rng = np.random.default_rng(100 + step)
        client.push(
            {KERNEL: rng.normal(size=(3, 2)), BIAS: rng.normal(size=2)},
            {TABLE: (np.array([1, 2, 5]), rng.normal(size=(3, TABLE_DIM)))},
        )
    for i in range(2):
        original = cluster.shard(i)
        saved = checkpoint.load_latest(_ckpt_dir(cluster, i))
        assert saved is not None
        version, arrays = saved
        assert version == 3
        # Adam's slots per row: the rows pushed (1, 2, 5) were last updated at step 3; the
        # others never.
        owned = np.arange(i, TABLE_ROWS, 2)
        last = arrays[f"table_slot/{TABLE}/last"]
        np.testing.assert_array_equal(last, np.where(np.isin(owned, [1, 2, 5]), 3, 0))
        untouched = ~np.isin(owned, [1, 2, 5])
        for slot in ("m", "v"):
            assert arrays[f"table_slot/{TABLE}/{slot}"].shape == (len(owned), TABLE_DIM)
            assert not arrays[f"table_slot/{TABLE}/{slot}"][untouched].any()
            assert arrays[f"table_slot/{TABLE}/{slot}"][~untouched].all()
        restored = ParameterShard(i, 2, keras.optimizers.Adam(0.01))
        restored.restore(version, arrays)
        for slot, values in original.tables[TABLE].optimizer.slots.items():
            np.testing.assert_array_equal(restored.tables[TABLE].optimizer.slots[slot], values)
        assert restored.initialized
        assert restored.version == original.version == 3
        _, original_dense = original.pull({}, True)[:2]
        _, restored_dense = restored.pull({}, True)[:2]
        assert set(restored_dense) == set(original_dense)
        for name, value in original_dense.items():
            np.testing.assert_array_equal(restored_dense[name], value)
        np.testing.assert_array_equal(
            restored.pull({TABLE: owned}, False)[2][TABLE],
            original.pull({TABLE: owned}, False)[2][TABLE],
        )
        assert restored.tables[TABLE].shape == original.tables[TABLE].shape

        # Without the optimizer's moments the next step differs ...
        fresh = ParameterShard(i, 2, keras.optimizers.Adam(0.01))
        fresh.restore(
            version,
            {k: v for k, v in arrays.items() if not k.startswith(("optimizer/", "table_slot/"))},
        )
        # ... with them it is the very step the original takes.
        expected = _adam_push(original, 7)
        got = _adam_push(restored, 7)
        other = _adam_push(fresh, 7)
        assert got[0] == expected[0] == 4
        for name, value in expected[1].items():
            np.testing.assert_allclose(got[1][name], value, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(got[2][TABLE], expected[2][TABLE], rtol=1e-6, atol=1e-7)
        assert not np.allclose(other[2][TABLE], expected[2][TABLE], rtol=1e-6, atol=1e-7)


def _save_three(directory: str, token: int = 1) -> None:
    for version in (1, 2, 3):
        x = {"dense/x": np.full(4, version, np.float32)}
        checkpoint.save(directory, version, x, keep=5, token=token)


def _set_aside(directory: Path) -> list[str]:
    aside = directory / "set-aside"
    return sorted(p.name for p in aside.iterdir()) if aside.exists() else []


def test_checkpoint_save_keeps_newest_and_load_latest(tmp_path: Path) -> None:
    directory = str(tmp_path / "ck")
    assert checkpoint.load_latest(directory) is None
    _save_three(directory)
    checkpoint.save(directory, 4, {"dense/x": np.full(4, 4, np.float32)}, keep=2, token=1)
    names = sorted(os.listdir(directory))
    assert names == ["version-000000000003-t1.npz", "version-000000000004-t1.npz"]
    version, arrays = checkpoint.load_latest(directory)
    assert version == 4
    np.testing.assert_array_equal(arrays["dense/x"], np.full(4, 4, np.float32))


def test_a_newer_masters_checkpoint_wins_over_a_higher_version_of_an_older_one(
    tmp_path: Path,
) -> None:
    """A PS of a replaced master, still running, writes on; the current master's PS, at a
    lower version, holds the model the job goes on with."""
    directory = str(tmp_path / "ck")
    _save_three(directory, token=2)
    checkpoint.save(directory, 9, {"dense/x": np.full(4, 9, np.float32)}, keep=5, token=1)
    version, arrays = checkpoint.load_latest(directory)
    assert version == 3 and arrays["dense/x"][0] == 3
    # The oldest by (token, version) go first, the stale version 9 before all.
    checkpoint.save(directory, 4, {"dense/x": np.full(4, 4, np.float32)}, keep=3, token=2)
    names = sorted(os.listdir(directory))
    assert names == [f"version-00000000000{v}-t2.npz" for v in (2, 3, 4)]


def test_a_checkpoint_of_an_older_version_without_a_token_counts_as_token_0(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "ck"
    directory.mkdir()
    buffer = io.BytesIO()
    np.savez(buffer, **{"dense/x": np.zeros(4, np.float32)})
    (directory / "version-000000000007.npz").write_bytes(buffer.getvalue())
    assert checkpoint.load_latest(str(directory))[0] == 7
    _save_three(str(directory), token=1)
    assert checkpoint.load_latest(str(directory))[0] == 3


def test_a_corrupt_newest_checkpoint_is_set_aside_and_the_next_loaded(
    tmp_path: Path, caplog
) -> None:
    directory = str(tmp_path / "ck")
    _save_three(directory)
    (tmp_path / "ck" / "version-000000000003-t1.npz").write_bytes(b"not a checkpoint at all")
    with caplog.at_level(logging.WARNING):
        version, arrays = checkpoint.load_latest(directory)
    assert version == 2
    np.testing.assert_array_equal(arrays["dense/x"], np.full(4, 2, np.float32))
    (kept,) = _set_aside(tmp_path / "ck")
    assert kept.endswith("version-000000000003-t1.npz")
    assert (tmp_path / "ck" / "set-aside" / kept).read_bytes() == b"not a checkpoint at all"
    (line,) = [r.getMessage() for r in caplog.records]
    assert "not a readable checkpoint" in line and "set aside as" in line
    # Read once: the next load does not meet it again.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert checkpoint.load_latest(directory)[0] == 2
    assert not caplog.records


@pytest.mark.parametrize("damage", ["truncated", "empty"])
def test_truncated_or_empty_newest_checkpoint_is_set_aside(tmp_path: Path, damage: str) -> None:
    directory = str(tmp_path / "ck")
    _save_three(directory)
    newest = tmp_path / "ck" / "version-000000000003-t1.npz"
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"")
    saved = checkpoint.load_latest(directory)
    assert saved is not None and saved[0] == 2
    assert len(_set_aside(tmp_path / "ck")) == 1


def test_a_stray_file_named_like_a_checkpoint_is_set_aside_not_crashed_on(
    tmp_path: Path, caplog
) -> None:
    directory = tmp_path / "ck"
    _save_three(str(directory))
    (directory / "version-latest.npz").write_bytes(b"someone's copy")
    (directory / "notes.txt").write_text("not ours, not named like ours: left alone")
    with caplog.at_level(logging.WARNING):
        assert checkpoint.load_latest(str(directory))[0] == 3
    (kept,) = _set_aside(directory)
    assert kept.endswith("version-latest.npz")
    (line,) = [r.getMessage() for r in caplog.records]
    assert "version-latest.npz: not a checkpoint's name" in line
    assert (directory / "notes.txt").exists()


# -- stopping: the final checkpoint --


def test_shut_down_serves_no_more_and_writes_a_final_checkpoint(
    start_cluster: StartCluster, tmp_path: Path
) -> None:
    cluster = start_cluster(num_ps=1, checkpoint_steps=0)
    client = cluster.initialized_client()
    for _ in range(3):
        client.push({BIAS: np.ones(2, np.float32)}, {})
    assert shut_down(cluster.servers[0], cluster.servicers[0], "ps-0", signal.SIGTERM) == 143
    saved = checkpoint.load_latest(_ckpt_dir(cluster, 0))
    assert saved is not None and saved[0] == 3
    np.testing.assert_allclose(saved[1][f"dense/{BIAS}"], _params()[0][BIAS] - 3 * LR, rtol=1e-6)
    with pytest.raises(PSUnavailableError, match="UNAVAILABLE"):
        client.pull()[0]


def test_shut_down_without_parameters_writes_nothing(
    start_cluster: StartCluster, tmp_path: Path
) -> None:
    cluster = start_cluster(num_ps=1)
    assert shut_down(cluster.servers[0], cluster.servicers[0], "ps-0", signal.SIGINT) == 130
    assert not (tmp_path / "checkpoints").exists()


MODEL_DEF = linear_regression(2)


class _JobMaster(master_pb2_grpc.MasterServicer):
    """Just enough of a master for one PS process: settings at Register, heartbeats."""

    def __init__(self, settings: master_pb2.JobSettings, reject: str = "") -> None:
        self.settings = settings
        self.reject = reject
        self.registered: queue.Queue[tuple[str, master_pb2.RegisterRequest]] = queue.Queue()

    def Register(self, request, context):
        if self.reject:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, self.reject)
        self.registered.put((auth.caller_name(context), request))
        return master_pb2.RegisterResponse(settings=self.settings)

    def Heartbeat(self, request, context):
        return master_pb2.HeartbeatResponse(finished=False)


@pytest.fixture
def job_master(tmp_path: Path) -> Iterator[tuple[_JobMaster, str]]:
    model_def = tmp_path / "model_def.py"
    model_def.write_text(MODEL_DEF)
    settings = master_pb2.JobSettings(
        model_def=str(model_def),
        output_dir=str(tmp_path),
        num_ps=1,
        checkpoint_steps=0,
        keep_checkpoints=2,
        master_timeout_s=30,
    )
    servicer = _JobMaster(settings)
    server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[AuthInterceptor(VERIFY_KEY)])
    master_pb2_grpc.add_MasterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None).wait()


def test_sigterm_to_a_ps_process_writes_a_final_checkpoint(
    job_master: tuple[_JobMaster, str], tmp_path: Path
) -> None:
    master, address = job_master
    import elastic_step

    env = {
        **os.environ,
        **JobKeys(SECRET, "job", tls=False).instance_env("ps-0"),
        "PYTHONPATH": str(Path(elastic_step.__file__).parents[1]),
        "ELASTIC_STEP_HOST": "127.0.0.1",
    }
    argv = ["ps", "--master", address, "--shard", "0", "--name", "ps-0"]
    log_path = tmp_path / "ps.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "elastic_step", *argv],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        caller, request = master.registered.get(timeout=120)
        assert caller == request.name == "ps-0"
        client = PSClient([request.address], WORKER, timeout_s=10)
        deadline = time.monotonic() + 60
        while True:  # UNAVAILABLE until the PS has its settings and optimizer
            try:
                client.initialize({"dense/kernel": np.ones((2, 1), np.float32)}, {}, {}, 0)
                break
            except PSUnavailableError:
                assert time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.2)
        for _ in range(2):
            client.push({"dense/kernel": np.ones((2, 1), np.float32)}, {})
        client.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 128 + signal.SIGTERM, log_path.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    saved = checkpoint.load_latest(OutputLayout(str(tmp_path)).checkpoint_dir(0, 1))
    assert saved is not None and saved[0] == 2, log_path.read_text()
    np.testing.assert_allclose(saved[1]["dense/dense/kernel"], [[0.8], [0.8]], rtol=1e-6)
    output = log_path.read_text()
    assert "SIGTERM received" in output
    assert SECRET not in output and env[auth.TOKEN_ENV] not in output
    assert SECRET not in " ".join(argv)


def test_ps_exits_1_when_the_master_rejects_it(
    job_master: tuple[_JobMaster, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    master, address = job_master
    master.reject = "ps-9 is not an instance of this job"
    for variable, value in JobKeys(SECRET, "job", tls=False).instance_env("ps-9").items():
        monkeypatch.setenv(variable, value)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    assert ps_main(["--master", address, "--shard", "0", "--name", "ps-9"]) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        "ps-9: master rejected Register: INVALID_ARGUMENT: ps-9 is not an instance of this job; "
        "exiting"
    ]
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers


def test_ps_without_its_credentials_exits_1(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(auth.TOKEN_ENV, raising=False)
    assert ps_main(["--master", "127.0.0.1:1", "--shard", "0", "--name", "ps-0"]) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        f"ps-0: {auth.TOKEN_ENV} is not set: the master gives every instance it launches its "
        "credentials; workers and PS cannot run without them; exiting"
    ]


# -- staleness modulation --


def _modulated_shard(version: int) -> ParameterShard:
    shard = ParameterShard(
        0, 1, keras.optimizers.SGD(LR), True, lambda name, shape: np.zeros((4, 2), np.float32)
    )
    dense = {"w": np.zeros(2, np.float32)}
    assert shard.initialize(dense, {TABLE: TableShape(4, 2, "float32")}, {}, version)
    return shard


def test_stale_push_is_scaled_by_staleness() -> None:
    shard = _modulated_shard(version=4)
    grad = np.array([1.0, -2.0], np.float32)
    row_grad = np.array([[4.0, 8.0]], np.float32)
    version, dense, rows = shard.push(
        {"w": grad}, {TABLE: (np.array([2]), row_grad)}, version=0, pull=({TABLE: [2]}, True)
    )
    assert version == 5
    np.testing.assert_allclose(dense["w"], -LR / 4 * grad, rtol=1e-6)
    np.testing.assert_allclose(rows[TABLE], -LR / 4 * row_grad, rtol=1e-6)
    assert float(shard._optimizer.learning_rate.numpy()) == pytest.approx(LR)
    # A fresh push afterwards moves at the full rate again.
    _, after, _ = shard.push({"w": grad}, {}, version=5, pull=({}, True))
    np.testing.assert_allclose(after["w"], -LR / 4 * grad - LR * grad, rtol=1e-6)


@pytest.mark.parametrize("staleness", [0, 1])
def test_fresh_push_uses_full_rate(staleness: int) -> None:
    shard = _modulated_shard(version=3)
    grad = np.array([1.0, -2.0], np.float32)
    _, dense, _ = shard.push({"w": grad}, {}, version=3 - staleness, pull=({}, True))
    np.testing.assert_allclose(dense["w"], -LR * grad, rtol=1e-6)


def test_without_modulation_stale_push_uses_full_rate() -> None:
    shard = ParameterShard(0, 1, keras.optimizers.SGD(LR))
    assert shard.initialize({"w": np.zeros(2, np.float32)}, {}, {}, 10)
    _, dense, _ = shard.push({"w": np.ones(2, np.float32)}, {}, 0, pull=({}, True))
    np.testing.assert_allclose(dense["w"], [-LR, -LR], rtol=1e-6)


def test_stale_push_over_grpc(start_cluster: StartCluster) -> None:
    cluster = start_cluster(staleness_modulation=True)
    fast, slow = cluster.client(), cluster.client()
    dense, _, _ = _params()
    fast.initialize(*_params(), model_version=0)
    slow.pull()[0]  # computes its gradients at version 0
    for _ in range(4):
        fast.push({}, {})
    grad = np.ones(2, np.float32)
    new_dense, _ = slow.push({BIAS: grad}, {})
    np.testing.assert_allclose(new_dense[BIAS], dense[BIAS] - LR / 4 * grad, rtol=1e-6)
    assert slow.versions == [5, 5]


def test_schedule_with_staleness_modulation_is_refused() -> None:
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.9)
    with pytest.raises(ValueError, match="constant learning rate"):
        ParameterShard(0, 1, keras.optimizers.SGD(schedule), staleness_modulation=True)
    ParameterShard(0, 1, keras.optimizers.SGD(schedule))  # fine without modulation


@pytest.mark.parametrize(
    ("flag", "local_steps", "schedule", "modulated", "why"),
    [
        (True, 1, False, True, "workers push gradients"),
        (False, 1, False, False, "--staleness-modulation false"),
        (True, 4, False, False, "windows of 4 steps"),
        (True, 1, True, False, "a schedule"),
    ],
)
def test_staleness_modulation_applies_to_gradients_at_a_constant_rate(
    flag: bool, local_steps: int, schedule: bool, modulated: bool, why: str
) -> None:
    """On by default; a PS divides the rate only where workers push gradients and the rate
    can be divided, and says why not elsewhere (its log)."""
    rate = (
        keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.9)
        if schedule
        else 0.1
    )
    settings = master_pb2.JobSettings(staleness_modulation=flag, local_steps=local_steps)
    got, reason = modulates_staleness(settings, keras.optimizers.SGD(rate))
    assert got is modulated and why in reason


def test_state_is_last_writer_wins_and_checkpointed(tmp_path: Path) -> None:
    shard = ParameterShard(0, 1, keras.optimizers.SGD(LR))
    kernel = np.ones((2, 2), np.float32)
    shard.initialize({"k": kernel}, {}, {}, 0, {"bn/mean": np.zeros(2, np.float32)})
    _, values = shard.pull({}, True)[:2]
    np.testing.assert_array_equal(values["bn/mean"], [0, 0])

    state = {"bn/mean": np.array([1, 2], "f4")}
    _, returned, _ = shard.push({"k": kernel}, {}, 0, state, pull=({}, True))
    assert "bn/mean" not in returned
    shard.push({"k": kernel}, {}, 1, {"bn/mean": np.array([3, 4], "f4")})
    _, values = shard.pull({}, True)[:2]
    np.testing.assert_array_equal(values["bn/mean"], [3, 4])

    version, arrays = shard.state_arrays()
    restored = ParameterShard(0, 1, keras.optimizers.SGD(LR))
    restored.restore(version, arrays)
    np.testing.assert_array_equal(restored.pull({}, True)[:2][1]["bn/mean"], [3, 4])


def test_a_checkpoint_is_streamed_both_ways(tmp_path):
    """Saving and loading hold no whole-file copy of a table: memory grows by at most a
    fraction of the table while it is written, and by the table alone while it is read."""
    import tracemalloc

    table = np.random.default_rng(0).random((1 << 24) // 8 * 8, dtype=np.float64)  # 128 MB
    tracemalloc.start()
    try:
        checkpoint.save(str(tmp_path), 3, {"table/t": table}, keep=1, token=1)
        _, saving_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        version, arrays = checkpoint.load_latest(str(tmp_path))
        _, loading_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert version == 3 and np.array_equal(arrays["table/t"], table)
    assert saving_peak < table.nbytes / 3, saving_peak
    assert loading_peak < table.nbytes * 1.3, loading_peak
