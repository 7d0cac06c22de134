"""The master's file state store: a journal with snapshots, group commit and a fencing lease;
it passes the StateStore contract (tests/contracts/state_store_contract.py)."""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from state_store_contract import STATE, StateStoreContract, record

from elastic_step.errors import InputError
from elastic_step.master.state_store import (
    FileStateStore,
    SavedState,
    StateStoreError,
    StateStoreFencedError,
    StateStoreLockedError,
    StateStoreSettings,
    create_state_store,
    replay,
)
from elastic_step.master.state_store import journal as journal_module

WAIT_S = 10.0  # the most any wait below takes; all of them normally take milliseconds


def owner(directory: Path, name: str = "master") -> FileStateStore:
    store = FileStateStore(str(directory))
    store.acquire(name, timeout_s=WAIT_S)
    return store


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("journal-*.log"))


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def new_store(directory: Path) -> Callable[[], FileStateStore]:
    return lambda: FileStateStore(str(directory))


class TestFileStateStoreContract(StateStoreContract):
    wait_s = WAIT_S

    def count_writes(self, store: FileStateStore, monkeypatch: pytest.MonkeyPatch) -> list:
        fsyncs = []
        real_fsync = os.fsync

        def counting_fsync(fd: int) -> None:
            fsyncs.append(fd)
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", counting_fsync)
        return fsyncs


# -- append, snapshot, load --


def test_the_snapshot_file_records_its_format_seq_and_token(directory: Path) -> None:
    store = owner(directory)
    store.append(record(1))
    store.append(record(2))
    store.snapshot(STATE)
    store.close()
    document = json.loads((directory / "snapshot.json").read_text())
    assert document == {"format": 2, "seq": 2, "token": 1, "state": STATE}


def test_a_store_that_never_acquired_the_lease_creates_nothing(directory: Path) -> None:
    store = FileStateStore(str(directory))
    assert store.load() == SavedState(None, [])
    with pytest.raises(StateStoreError, match="acquire the lease before writing"):
        store.append(record(1))
    store.close()
    assert not directory.exists()


def test_a_snapshot_of_another_format_is_an_error_naming_it(directory: Path) -> None:
    directory.mkdir()
    path = directory / "snapshot.json"
    path.write_text(json.dumps({"format": 1, "state": STATE}))
    with pytest.raises(StateStoreError) as info:
        FileStateStore(str(directory)).load()
    assert str(info.value) == f"snapshot {path} has format 1, this version reads format 2"

    path.write_text('{"format": 2, "seq": 3, "state": {"mod')
    with pytest.raises(StateStoreError, match=r"snapshot .*snapshot\.json is not valid JSON"):
        FileStateStore(str(directory)).load()


# -- replay after a crash --


def write_one_by_one(directory: Path, count: int) -> list[int]:
    """Writes records 0..count-1, each durable alone; returns the journal's size after each."""
    store = owner(directory)
    sizes = [0]
    for i in range(count):
        store.append(record(i))
        store.flush(WAIT_S)
        sizes.append(segments(directory)[0].stat().st_size)
    store.close()
    return sizes


def test_replay_after_a_crash_at_every_byte_returns_the_whole_records_before_it(
    directory: Path, tmp_path: Path
) -> None:
    sizes = write_one_by_one(directory, 12)
    (journal,) = segments(directory)
    data = journal.read_bytes()
    crashed = tmp_path / "crashed"
    shutil.copytree(directory, crashed)
    for length in range(len(data) + 1):
        (crashed / journal.name).write_bytes(data[:length])
        whole = max(k for k, size in enumerate(sizes) if size <= length)
        loaded = FileStateStore(str(crashed)).load()
        assert loaded == SavedState(None, [record(i) for i in range(whole)]), length


@pytest.mark.parametrize("damage", ["torn", "bad crc"])
def test_a_damaged_last_record_ends_the_replay_and_the_next_owner_writes_after_it(
    directory: Path, damage: str
) -> None:
    sizes = write_one_by_one(directory, 5)
    (journal,) = segments(directory)
    data = bytearray(journal.read_bytes())
    if damage == "torn":
        del data[sizes[4] + 7 :]  # the last frame cut mid-header
    else:
        data[-2] ^= 0xFF  # a byte of the last record's JSON
    journal.write_bytes(bytes(data))
    before = [record(i) for i in range(4)]
    assert FileStateStore(str(directory)).load() == SavedState(None, before)

    store = owner(directory)
    assert journal.stat().st_size == sizes[4]  # the damaged tail is gone
    store.append(record(99))
    store.close()
    assert FileStateStore(str(directory)).load() == SavedState(None, [*before, record(99)])


def test_damage_mid_journal_sets_aside_the_rest_and_later_segments_never_deletes_them(
    directory: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sizes = write_one_by_one(directory, 5)
    (journal,) = segments(directory)
    later = directory / journal_module.segment_name(6)
    later.write_bytes(journal_module.encode_frame(6, record(5)))
    data = bytearray(journal.read_bytes())
    data[sizes[2] + 20] ^= 0xFF  # inside record 3 of 5: a bad CRC, good records after it
    journal.write_bytes(bytes(data))
    past = bytes(data[sizes[2] :])

    with caplog.at_level(logging.INFO, logger="elastic_step"):
        store = owner(directory)
    assert journal.stat().st_size == sizes[2] and not later.exists()
    aside = sorted((directory / "set-aside").iterdir())
    assert [p.name.split("-", 1)[1] for p in aside] == [
        f"{journal.name}.from-byte-{sizes[2]}",
        later.name,
    ]
    assert aside[0].read_bytes() == past
    assert aside[1].read_bytes() == journal_module.encode_frame(6, record(5))
    (line,) = [r.getMessage() for r in caplog.records if "journal ended" in r.getMessage()]
    assert f"set aside its {len(past)} bytes from there and 1 later segment(s)" in line
    assert "resumes after record 2" in line
    store.append(record(99))
    store.close()
    loaded = FileStateStore(str(directory)).load()
    assert loaded == SavedState(None, [record(0), record(1), record(99)])


def test_a_record_out_of_sequence_ends_the_replay(directory: Path) -> None:
    write_one_by_one(directory, 3)
    (journal,) = segments(directory)
    data = journal.read_bytes()
    journal.write_bytes(data + data)  # records 1..3 again: 1 follows 3
    assert FileStateStore(str(directory)).load().records == [record(i) for i in range(3)]


# -- compaction --


def test_a_durable_snapshot_removes_the_segments_it_covers(directory: Path) -> None:
    store = owner(directory)
    for i in range(5):
        store.append(record(i))
    store.flush(WAIT_S)
    first = segments(directory)
    store.snapshot(STATE)
    store.append(record(5))
    store.append(record(6))
    store.flush(WAIT_S)

    remaining = segments(directory)
    assert [p.name for p in remaining] == ["journal-00000000000000000006.log"]
    assert not set(first) & set(remaining)
    assert store.load() == SavedState(STATE, [record(5), record(6)])
    store.close()


def test_a_crash_before_the_old_segments_are_deleted_still_loads_right(
    directory: Path, tmp_path: Path
) -> None:
    store = owner(directory)
    for i in range(5):
        store.append(record(i))
    store.flush(WAIT_S)
    saved = tmp_path / "old-segments"
    saved.mkdir()
    for path in segments(directory):
        shutil.copy2(path, saved / path.name)
    store.snapshot(STATE)
    store.append(record(5))
    store.close()
    for path in saved.iterdir():  # as if the crash came right after the snapshot's rename
        shutil.copy2(path, directory / path.name)

    assert FileStateStore(str(directory)).load() == SavedState(STATE, [record(5)])
    store = owner(directory)  # repairs: the covered segments go
    assert [p.name for p in segments(directory)] == ["journal-00000000000000000006.log"]
    store.append(record(6))
    store.close()
    assert FileStateStore(str(directory)).load() == SavedState(STATE, [record(5), record(6)])


def test_a_crash_before_the_snapshot_is_renamed_loads_the_older_snapshot_and_all_records(
    directory: Path, tmp_path: Path
) -> None:
    store = owner(directory)
    store.snapshot({"old": True})
    for i in range(3):
        store.append(record(i))
    store.flush(WAIT_S)
    saved = tmp_path / "saved"
    shutil.copytree(directory, saved)
    store.snapshot(STATE)
    store.append(record(3))
    store.close()
    # The new segment exists, but the old snapshot and segments are back: a crash after the
    # new segment was created and before the new snapshot replaced the old.
    for name in ["snapshot.json", *(p.name for p in segments(saved))]:
        shutil.copy2(saved / name, directory / name)

    loaded = FileStateStore(str(directory)).load()
    assert loaded == SavedState({"old": True}, [record(i) for i in range(4)])


@pytest.mark.parametrize("when", ["before the reader lists the segments", "after"])
def test_a_reader_whose_snapshot_is_replaced_while_it_reads_reads_again(
    directory: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    store = owner(directory)
    store.snapshot({"upto": -1})
    for i in range(5):
        store.append(record(i))
    store.flush(WAIT_S)
    real_list = replay.list_segments
    compacted = []

    def compact() -> None:
        store.snapshot({"upto": 4})
        store.append(record(5))
        store.flush(WAIT_S)  # deletes the segment of records 0..4
        compacted.append(True)

    def list_segments_racing_the_owner(path: str) -> list[tuple[int, str]]:
        if compacted:
            return real_list(path)
        if when == "after":
            listed = real_list(path)
            compact()
            return listed  # names a segment that is gone
        compact()
        return real_list(path)  # records 0..4 are gone, under the older snapshot

    monkeypatch.setattr(replay, "list_segments", list_segments_racing_the_owner)
    assert FileStateStore(str(directory)).load() == SavedState({"upto": 4}, [record(5)])
    assert compacted == [True]
    store.close()


# -- the lease --

HOLDER = """
import sys
from elastic_step.master.state_store import FileStateStore
store = FileStateStore(sys.argv[1])
token = store.acquire("first-master", timeout_s=10)
store.append({"by": "first"})
store.flush(10)
print(token, flush=True)
sys.stdin.read()  # hold the lease until killed
"""


def start_holder(directory: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parents[2],
        text=True,
    )
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=60):  # a cold interpreter on a busy machine
            proc.kill()
            pytest.fail("the holder process did not take the lease in 60 s")
    return proc, int(proc.stdout.readline())


def test_a_second_process_cannot_take_the_lease_until_the_first_dies(directory: Path) -> None:
    proc, first_token = start_holder(directory)
    try:
        contender = FileStateStore(str(directory))
        started = time.monotonic()
        with pytest.raises(StateStoreLockedError) as info:
            contender.acquire("second-master", timeout_s=0.3)
        assert 0.3 <= time.monotonic() - started < 0.3 + WAIT_S
        assert f"held by first-master (pid {proc.pid}" in str(info.value)
        assert "waited 0.3 s" in str(info.value)
    finally:
        proc.kill()  # SIGKILL: no close(), the OS releases the flock
        proc.wait(WAIT_S)
    store = FileStateStore(str(directory))
    assert store.acquire("second-master", timeout_s=WAIT_S) > first_token
    assert store.load() == SavedState(None, [{"by": "first"}])
    store.close()


def test_a_waiting_owner_gets_the_lease_once_the_holder_closes(directory: Path) -> None:
    first = owner(directory, "first")
    tokens: list[int] = []
    second = FileStateStore(str(directory))
    waiter = threading.Thread(target=lambda: tokens.append(second.acquire("second", WAIT_S)))
    waiter.start()
    time.sleep(0.05)
    assert waiter.is_alive()  # waiting for the lease
    first.close()
    waiter.join(WAIT_S)
    assert tokens == [2]
    second.close()


def test_an_owner_whose_token_was_superseded_is_fenced(directory: Path) -> None:
    store = owner(directory)
    store.append(record(1))
    store.flush(WAIT_S)
    # A successor took over (on a shared file system whose locks were lost).
    (directory / "token").write_text("2\n")

    store.append(record(2))
    with pytest.raises(StateStoreFencedError, match=r"its token is 1, the job's is now 2"):
        store.flush(WAIT_S)
    with pytest.raises(StateStoreFencedError):
        store.append(record(3))
    with pytest.raises(StateStoreFencedError):
        store.snapshot(STATE)
    with pytest.raises(StateStoreFencedError):
        store.close()
    assert FileStateStore(str(directory)).load() == SavedState(None, [record(1)])
    assert not (directory / "snapshot.json").exists()
    assert owner(directory).load() == SavedState(None, [record(1)])  # close released the lease


def test_flush_confirms_the_lease_even_with_nothing_to_write(directory: Path) -> None:
    store = owner(directory)
    store.flush(WAIT_S)
    (directory / "token").write_text("5\n")
    with pytest.raises(StateStoreFencedError, match=r"its token is 1, the job's is now 5"):
        store.flush(WAIT_S)
    with pytest.raises(StateStoreFencedError):
        store.append(record(1))
    with pytest.raises(StateStoreFencedError):
        store.close()


# -- group commit --


def test_snapshot_due_after_the_configured_number_of_records(directory: Path) -> None:
    store = FileStateStore(str(directory), StateStoreSettings(snapshot_every_records=3))
    store.acquire("master", timeout_s=WAIT_S)
    due = []
    for i in range(3):
        store.append(record(i))
        due.append(store.snapshot_due())
    store.snapshot(STATE)
    due.append(store.snapshot_due())
    assert due == [False, False, True, False]
    store.close()


def test_settings_state_the_rule_they_break() -> None:
    with pytest.raises(ValueError, match="snapshot_every_records must be at least 1, got 0"):
        StateStoreSettings(snapshot_every_records=0)
    with pytest.raises(ValueError, match=r"close_timeout_s must be >= 0, got -1"):
        StateStoreSettings(close_timeout_s=-1)


# -- the registry --


def test_create_state_store_file_keeps_the_state_under_the_output_dir(tmp_path: Path) -> None:
    store = create_state_store("file", str(tmp_path))
    assert isinstance(store, FileStateStore)
    assert store.describe() == str(tmp_path / "master-state")
    store.acquire("master", timeout_s=WAIT_S)
    store.snapshot(STATE)
    store.close()
    assert os.listdir(tmp_path) == ["master-state"]
    assert create_state_store("file", f"file://{tmp_path}").load() == SavedState(STATE, [])


def test_the_file_store_needs_a_local_path() -> None:
    with pytest.raises(StateStoreError) as info:
        create_state_store("file", "s3://bucket/job")
    assert "the file state store needs a local path, got s3://bucket/job/master-state" in str(
        info.value
    )


def test_create_state_store_rejects_an_unknown_name_with_the_rule(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        create_state_store("redis", str(tmp_path))
    assert str(info.value) == "--state-store must be one of file, kubernetes, got 'redis'"


def test_the_state_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    # The snapshot holds the job's secret.
    store = create_state_store("file", str(tmp_path))
    store.acquire("master", timeout_s=WAIT_S)
    store.snapshot(STATE)
    store.append({"op": "x"})
    store.close()
    state_dir = tmp_path / "master-state"
    assert state_dir.stat().st_mode & 0o777 == 0o700
    for path in state_dir.iterdir():
        assert path.stat().st_mode & 0o077 == 0, path


def test_the_job_secret_is_kept_apart_and_outlives_the_owner(tmp_path: Path) -> None:
    first = create_state_store("file", str(tmp_path))
    first.acquire("master-a", timeout_s=WAIT_S)
    secret = first.job_secret()
    assert len(secret) == 64 and first.job_secret() == secret
    first.snapshot(STATE)
    first.close()
    second = create_state_store("file", str(tmp_path))
    second.acquire("master-b", timeout_s=WAIT_S)
    assert second.job_secret() == secret
    second.close()
    assert secret not in (tmp_path / "master-state" / "snapshot.json").read_text()
