"""The master's state store: a JSON file replaced atomically, and the store registry."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from elastic_step.data import storage
from elastic_step.errors import InputError
from elastic_step.master.state_store import (
    STATE_FILE,
    FileStateStore,
    StateStoreError,
    create_state_store,
)

STATE = {
    "tasks": {"train_todo": [{"id": 3, "shard": "a", "start": 0, "end": 4}], "done": [1, 2]},
    "model_version": 17,
    "epoch_accounting": {"1": 1000},
    "phase": "running",
    "metrics": [{"accuracy": 0.75, "loss": None}],
}


def test_load_without_a_save_is_none(tmp_path: Path) -> None:
    assert FileStateStore(str(tmp_path / "state.json")).load() is None


def test_save_then_load_returns_the_same_state(tmp_path: Path) -> None:
    path = str(tmp_path / "state.json")
    FileStateStore(path).save(STATE)
    assert FileStateStore(path).load() == STATE  # a new store, as after a master restart


def test_a_save_replaces_the_whole_state_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    store = FileStateStore(str(path))
    store.save(STATE)
    store.save({"model_version": 18})

    assert store.load() == {"model_version": 18}
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_save_that_fails_midway_leaves_the_previous_state_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "state.json")
    store = FileStateStore(path)
    store.save(STATE)

    def broken_rename(self, src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage.LocalStorage, "rename", broken_rename)
    with pytest.raises(StateStoreError, match="No space left on device"):
        store.save({"model_version": 18})
    monkeypatch.undo()

    assert FileStateStore(path).load() == STATE


def test_the_file_records_its_format_version(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    FileStateStore(str(path)).save(STATE)
    document = json.loads(path.read_text())
    assert document == {"format": 1, "state": STATE}


def test_a_corrupted_file_is_an_error_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"format": 1, "state": {"model_ver')  # cut short
    with pytest.raises(StateStoreError, match=r"cannot read master state .*state\.json"):
        FileStateStore(str(path)).load()


def test_a_state_of_another_format_version_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"format": 99, "state": STATE}))
    with pytest.raises(StateStoreError) as info:
        FileStateStore(str(path)).load()
    message = str(info.value)
    assert str(path) in message
    assert "format 99" in message
    assert "reads format 1" in message


def test_a_state_file_that_is_not_a_json_object_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("null")
    with pytest.raises(StateStoreError, match=r"state\.json"):
        FileStateStore(str(path)).load()


def test_a_save_that_cannot_be_written_is_an_error_naming_the_path(tmp_path: Path) -> None:
    path = str(tmp_path / "missing-dir" / "state.json")
    with pytest.raises(StateStoreError, match=r"cannot save master state .*missing-dir"):
        FileStateStore(path).save(STATE)


def test_describe_names_the_file(tmp_path: Path) -> None:
    path = str(tmp_path / "state.json")
    assert FileStateStore(path).describe() == path


def test_create_state_store_file_keeps_the_state_in_the_output_dir(tmp_path: Path) -> None:
    store = create_state_store("file", str(tmp_path))
    assert isinstance(store, FileStateStore)
    store.save(STATE)
    assert os.listdir(tmp_path) == [STATE_FILE]
    assert create_state_store("file", f"file://{tmp_path}").load() == STATE


def test_create_state_store_rejects_an_unknown_name_with_the_rule(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        create_state_store("redis", str(tmp_path))
    assert str(info.value) == "--state-store must be one of file, got 'redis'"
