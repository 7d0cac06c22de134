"""Beam's distributed runners on loopback, for the tests of this directory: a Dask scheduler
with two worker processes, and an external pool of Beam SDK workers for Prism (whose binary
`make prism` builds). bench/beam_clusters.py starts them, as it does for the benchmark; each
is started once per session and stopped at its end."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from beam_clusters import Cluster, PeakMemory


def started(runner: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        cluster = Cluster(runner, str(tmp_path_factory.mktemp(runner)), PeakMemory())
    except SystemExit as e:  # what the benchmark ends with when a process does not start
        pytest.fail(str(e))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def dask_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A Dask scheduler and 2 worker processes (a thread each); ``options`` run on them."""
    yield from started("dask", tmp_path_factory)


@pytest.fixture(scope="session")
def worker_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Beam's external SDK worker pool; ``options`` run Prism with it."""
    yield from started("prism", tmp_path_factory)
