"""Vocabularies (data/vocabulary.py): counted exactly within a memory bound, chosen by
--max-vocabulary and --min-frequency, kept in files, looked up by TF with --oov-buckets, or
hashed with --hash-buckets; the ids the same in every run and every process."""

from __future__ import annotations

import collections
import json
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from file_trees import tree

from elastic_step.cli import main
from elastic_step.data.schema import Schema
from elastic_step.data.vocabulary import ValueCounter, VocabularyOptions, parse_hash_buckets
from elastic_step.errors import InputError


def _values(n: int, seed: int) -> list[str]:
    """Zipf-like ids, a few with a tab or a line break, and the empty value."""
    rng = random.Random(seed)
    values = [f"id{int(rng.paretovariate(0.8)) % 5000}" for _ in range(n)]
    return [*values, "", "", "a\tb", "a\tb", "two\nlines", "two\nlines"]


def _expected(values: list[str], max_size: int | None, min_frequency: int) -> list[str]:
    counts = collections.Counter(v for v in values if not any(c in v for c in "\t\r\n"))
    kept = [v for v, n in counts.items() if n >= min_frequency]
    # Ties by UTF-8 bytes, which is code point order: Python's own.
    kept.sort(key=lambda v: (-counts[v], v))
    return kept[:max_size]


@pytest.mark.parametrize("max_size,min_frequency", [(None, 1), (50, 1), (None, 3), (7, 2)])
def test_counts_that_spill_choose_what_counts_in_memory_choose(
    tmp_path: Path, max_size: int | None, min_frequency: int
) -> None:
    values = _values(20_000, seed=1)
    in_memory = ValueCounter(memory_values=10**9)
    spilling = ValueCounter(memory_values=300, spill_dir=str(tmp_path / "counts"))
    for start in range(0, len(values), 997):
        batch = pa.array(values[start : start + 997])
        in_memory.add(batch)
        spilling.add(batch)
    assert list((tmp_path / "counts").glob("part-*.arrow")), "the small bound spilled"
    want = _expected(values, max_size, min_frequency)
    for counter in (in_memory, spilling):
        chosen = counter.choose(max_size, min_frequency)
        assert chosen.entries.to_pylist() == want
        counts = collections.Counter(values)
        assert chosen.counts.to_pylist() == [counts[v] for v in want]
        assert chosen.distinct == len(counts)
    spilling.close()
    assert not (tmp_path / "counts").exists()


def test_counts_of_parts_merge_into_the_whole(tmp_path: Path) -> None:
    values = _values(5_000, seed=2)
    whole = ValueCounter(memory_values=200, spill_dir=str(tmp_path / "whole"))
    for start in range(0, len(values), 1000):
        part = ValueCounter(memory_values=10**9)
        part.add(pa.array(values[start : start + 1000]))
        whole.merge(pickle.loads(pickle.dumps(part)))  # as a Beam worker sends it back
    assert whole.choose(None, 1).entries.to_pylist() == _expected(values, None, 1)
    spilled = ValueCounter(memory_values=10, spill_dir=str(tmp_path / "spilled"))
    spilled.add(pa.array(values))
    with pytest.raises(ValueError, match="stay on their machine"):
        pickle.dumps(spilled)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"max_size": 0}, r"--max-vocabulary must be an integer >= 1, got 0"),
        ({"min_frequency": 0}, r"--min-frequency must be an integer >= 1, got 0"),
        ({"oov_buckets": 0}, r"--oov-buckets must be an integer >= 1, got 0"),
        ({"hash_buckets": {"user": 0}}, r"--hash-buckets user=0: buckets must be an integer"),
    ],
)
def test_options_name_the_value_and_the_rule(kwargs: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        VocabularyOptions(**kwargs)


def test_hash_buckets_parse() -> None:
    assert parse_hash_buckets(" user=10, a=b=3 ,") == {"user": 10, "a=b": 3}
    for bad in ("user", "user=", "=5", "user=-1", "user=x"):
        with pytest.raises(InputError, match=r"expected COLUMN=N"):
            parse_hash_buckets(bad)
    with pytest.raises(InputError, match=r"column 'u' is given twice"):
        parse_hash_buckets("u=1,u=2")


# --- through preprocess, the feed and a second process ---------------------------------------

ROWS = 3_000


@pytest.fixture(scope="module")
def clicks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rows with a user id (many values, most seen once or twice), a city (few), a number and
    a label."""
    rng = random.Random(7)
    path = tmp_path_factory.mktemp("clicks") / "clicks.csv"
    lines = ["user,city,x,clicked"]
    for _ in range(ROWS):
        user = f"u{int(rng.paretovariate(0.5)) % 4000}"
        city = rng.choice(["lyon", "oslo", "kyiv", "lima", "pune", ""])
        lines.append(f"{user},{city},{rng.random():.4f},{rng.randint(0, 1)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _preprocess(csv: Path, out: Path, *flags: str) -> None:
    argv = ["preprocess", "--input", str(csv), "--label", "clicked", "--output", str(out)]
    assert main([*argv, *flags]) == 0


#: Looks up ids of the values in argv[2] with the default feed of the data in argv[1].
IDS = """
import json, sys
import tensorflow as tf
from elastic_step.data.feed import DefaultFeed
from elastic_step.data.schema import Schema
schema = Schema.load(sys.argv[1])
feed = DefaultFeed(schema)
values = json.loads(sys.argv[2])
print(json.dumps({c.name: feed.features({**{k.name: tf.constant([0.0] * len(values))
    for k in schema.columns if k.kind == "numeric"},
    **{k.name: tf.constant(values) for k in schema.columns if k.kind == "categorical"}})[
    c.input_name].numpy().tolist() for c in schema.columns if c.kind == "categorical"}))
"""


def _ids_in_a_new_process(data: Path, values: list[str]) -> dict[str, list[int]]:
    result = subprocess.run(
        [sys.executable, "-c", IDS, str(data), json.dumps(values)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_capped_vocabulary_with_oov_buckets_and_a_hashed_column(
    clicks: Path, tmp_path: Path
) -> None:
    flags = ["--max-vocabulary", "40", "--oov-buckets", "8", "--hash-buckets", "user=5000"]
    first, second = tmp_path / "first", tmp_path / "second"
    _preprocess(clicks, first, *flags)
    _preprocess(clicks, second, *flags)
    assert tree(first) == tree(second)

    schema = Schema.load(str(first))
    user, city = schema.feature("user"), schema.feature("city")
    assert user.hashed and user.num_ids == 5000 and user.vocabulary_file is None
    assert city.vocabulary_size == 6 and city.oov_buckets == 8 and city.num_ids == 14
    assert "" in schema.vocabulary(city)  # an empty cell is a value like any other
    assert not (first / "vocabularies" / "000-user.txt").exists()
    document = json.loads((first / "schema.json").read_text())
    assert not any("vocabulary" in column for column in document["columns"])  # in files

    # The ids: each entry its line, unseen values spread over the 8 buckets after them, the
    # user hashed; the same in two processes.
    unseen = [f"nowhere-{i}" for i in range(40)]
    values = [*schema.vocabulary(city), *unseen]
    ids = _ids_in_a_new_process(first, values)
    assert ids == _ids_in_a_new_process(second, values)
    assert ids["city"][:6] == list(range(6))
    assert set(ids["city"][6:]) <= set(range(6, 14)) and len(set(ids["city"][6:])) > 4
    assert all(0 <= i < 5000 for i in ids["user"]) and len(set(ids["user"])) > 40


def test_max_vocabulary_keeps_the_most_frequent_ids(clicks: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    _preprocess(clicks, out, "--max-vocabulary", "100", "--min-frequency", "2")
    schema = Schema.load(str(out))
    users = [line.split(",")[0] for line in clicks.read_text().splitlines()[1:]]
    assert schema.vocabulary(schema.feature("user")) == _expected(users, 100, 2)
    lines = (out / "vocabularies" / "000-user.txt").read_text().splitlines()
    counts = collections.Counter(users)
    assert [line.split("\t") for line in lines[:3]] == [
        [user, str(counts[user])] for user in _expected(users, 3, 2)
    ]


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--hash-buckets", "user"], "--hash-buckets 'user': expected COLUMN=N"),
        (["--hash-buckets", "nobody=5"], "--hash-buckets nobody: no such column in"),
        (["--hash-buckets", "clicked=5"], "--hash-buckets clicked: the label column cannot"),
        (["--max-vocabulary", "-1"], "--max-vocabulary must be an integer >= 1, got -1"),
        (["--oov-buckets", "0"], "--oov-buckets must be an integer >= 1, got 0"),
    ],
)
def test_bad_vocabulary_flags_exit_2_in_one_line(
    clicks: Path, tmp_path: Path, flags: list[str], message: str
) -> None:
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "elastic_step", "preprocess", "--input", str(clicks),
         "--label", "clicked", "--output", str(out), *flags],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    [line] = [s for s in result.stderr.splitlines() if s.strip()]
    assert message in line, line
    assert not out.exists()


def test_beam_writes_the_same_vocabularies(clicks: Path, tmp_path: Path) -> None:
    """The Beam pipeline counts each range apart and merges the counts (past the bound, on
    the driver's disk): the same files as the single-machine path."""
    pytest.importorskip("apache_beam")
    flags = ["--max-vocabulary", "300", "--oov-buckets", "4", "--hash-buckets", "city=16"]
    _preprocess(clicks, tmp_path / "local", *flags)
    _preprocess(clicks, tmp_path / "beam", *flags, "--runner", "beam")
    assert tree(tmp_path / "beam") == tree(tmp_path / "local")
    assert (tmp_path / "local" / "vocabularies" / "000-user.txt").exists()


def test_a_vocabulary_table_is_shared_while_held_and_freed_with_its_last_holder(tmp_path):
    """The feed and the serving layer of one process look values up in one table per file;
    once neither holds it, its memory is freed (it is anonymous: TF's resource manager does
    not keep it)."""
    import dataclasses
    import gc
    import os
    import weakref

    import tensorflow as tf

    from elastic_step.data import vocabulary
    from elastic_step.data.feed import vocabulary_table

    path = str(tmp_path / "colors.txt")
    entries = ["red", "green", "blue"]
    chosen = vocabulary.Chosen(
        entries=pa.array(entries, pa.large_string()),
        counts=pa.array([3, 2, 1], pa.int64()),
        distinct=3,
    )
    vocabulary.write(path, chosen)
    feeds, servings = vocabulary_table(path, 3, 2), vocabulary_table(path, 3, 2)
    assert feeds is servings
    assert vocabulary_table(path, 3, 1) is not feeds  # other ids for other values: its own
    ids = feeds.lookup(tf.constant(["green", "blue", "mauve"])).numpy().tolist()
    assert ids[:2] == [1, 2] and ids[2] in (3, 4)
    # The file written again (preprocess run again in place): its new values, a new table.
    vocabulary.write(
        path,
        dataclasses.replace(chosen, entries=pa.array(["blue", "red", "green"], pa.large_string())),
    )
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    again = vocabulary_table(path, 3, 2)
    assert again is not feeds
    assert again.lookup(tf.constant(["blue"])).numpy().tolist() == [0]
    del again
    table = weakref.ref(feeds)
    del feeds, servings
    gc.collect()
    assert table() is None
