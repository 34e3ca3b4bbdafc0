"""The Timeline operator (rl.data.timeline) and its sharded run (rl.data.sharding):
hand-computed outputs for small MDPs with gaps, duplicates, one-row MDPs and
missing features; shuffled input split over files of every format; the sharded
result equal to the single-worker one."""
import random

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")

from rl.data.output import SUCCESS, read_metadata  # noqa: E402
from rl.data.records import RecordBuilder  # noqa: E402
from rl.data.sharding import run_timeline, shard_of  # noqa: E402
from rl.data.timeline import compute_timeline, discounted_values  # noqa: E402
from rl.data.transitions import read_table  # noqa: E402
from rl.data.writers import write_logged_rows  # noqa: E402

pytestmark = pytest.mark.timeout(120)

GAMMA = 0.5


def row(mdp, seq, features, action, reward, probability=0.5, possible=None):
    out = {"mdp_id": mdp, "sequence_number": seq, "state_features": features, "action": action,
           "action_probability": probability, "reward": reward}
    if possible is not None:
        out["possible_actions"] = possible
    return out


# MDP "a": sequence numbers 1, 3, 4, 8 (gaps), feature "f0" missing on the 2nd row.
# MDP "b": one row.  MDP "c": two rows share sequence number 2 (c1 comes first in input).
ROWS = [
    row("a", 1, {"f0": 1.0, "f1": 10.0}, "L", 1.0, 0.5, ["L", "R"]),
    row("a", 3, {"f1": 11.0}, "R", 2.0, 0.25, ["R"]),
    row("a", 4, {"f0": 3.0, "f1": None}, "L", 3.0, 1.0, ["L", "R"]),
    row("a", 8, {"f0": 4.0}, "R", 4.0, 0.75, ["L"]),
    row("b", 5, {"f1": 7.0}, "L", 7.0, 0.5, ["L", "R"]),
    row("c", 2, {"f0": 0.5}, "x", 1.0, 0.5, ["x", "y"]),
    row("c", 2, {"f0": 0.6}, "y", 1.0, 0.5, ["x", "y"]),
    row("c", 5, {}, "x", 1.0, 0.5, ["x"]),
]

# (mdp, seq, ordinal, time_diff, time_since_first, next state, next action, next prob,
#  possible next, reward_timeline with horizon 2, episode_value with gamma 0.5, terminal)
EXPECTED = [
    ("a", 1, 1, 2, 0, {"f1": 11.0}, "R", 0.25, ["R"], {0: 1.0, 1: 2.0, 2: 3.0},
     1 + 0.5 ** 2 * 2 + 0.5 ** 3 * 3 + 0.5 ** 7 * 4, False),
    ("a", 3, 2, 1, 2, {"f0": 3.0}, "L", 1.0, ["L", "R"], {0: 2.0, 1: 3.0, 2: 4.0},
     2 + 0.5 * 3 + 0.5 ** 5 * 4, False),
    ("a", 4, 3, 4, 3, {"f0": 4.0}, "R", 0.75, ["L"], {0: 3.0, 1: 4.0}, 3 + 0.5 ** 4 * 4, False),
    ("a", 8, 4, 0, 7, {}, "", 0.0, [], {0: 4.0}, 4.0, True),
    ("b", 5, 1, 0, 0, {}, "", 0.0, [], {0: 7.0}, 7.0, True),
    ("c", 2, 1, 0, 0, {"f0": 0.6}, "y", 0.5, ["x", "y"], {0: 1.0, 1: 1.0, 2: 1.0}, 2.125, False),
    ("c", 2, 2, 3, 0, {}, "x", 0.5, ["x"], {0: 1.0, 1: 1.0}, 1.125, False),
    ("c", 5, 3, 0, 3, {}, "", 0.0, [], {0: 1.0}, 1.0, True),
]


def canonical(rows, reward_metric=None):
    builder = RecordBuilder(reward_metric)
    for position, record in enumerate(rows):
        builder.add(record, position)
    return builder.table()


MAP_COLUMNS = ("state_features", "next_state_features", "reward_timeline", "metrics", "action",
               "next_action")


def as_records(table):
    """Output rows as dicts (maps as dicts), sorted by MDP and ordinal."""
    records = table.to_pylist()
    for record in records:
        for name, value in record.items():
            if isinstance(value, list) and value and isinstance(value[0], tuple):
                record[name] = dict(value)
            elif name in MAP_COLUMNS and value == []:
                record[name] = {}
    return sorted(records, key=lambda r: (r["mdp_id"], r["sequence_number_ordinal"]))


def check_expected(records):
    assert len(records) == len(EXPECTED)
    for got, want in zip(records, EXPECTED):
        (mdp, seq, ordinal, time_diff, since_first, next_state, next_action, next_probability,
         possible_next, timeline, value, terminal) = want
        assert (got["mdp_id"], got["sequence_number"], got["sequence_number_ordinal"]) == \
            (mdp, seq, ordinal)
        assert got["time_diff"] == time_diff
        assert got["time_since_first"] == since_first
        assert got["next_state_features"] == next_state
        assert got["next_action"] == next_action
        assert got["next_action_probability"] == next_probability
        assert got["possible_next_actions"] == possible_next
        assert got["reward_timeline"] == timeline
        assert got["episode_value"] == pytest.approx(value, rel=1e-12)
        assert got["terminal"] is terminal


def test_compute_timeline_hand_computed():
    out = compute_timeline(canonical(ROWS), GAMMA, reward_horizon=2)
    records = as_records(out)
    check_expected(records)
    # the logged fields pass through unchanged; a null feature value is a missing feature
    a3 = records[2]
    assert a3["state_features"] == {"f0": 3.0}
    assert (a3["action"], a3["action_probability"], a3["reward"]) == ("L", 1.0, 3.0)
    assert records[5]["action"] == "x" and records[6]["action"] == "y"  # duplicates: input order


def test_compute_timeline_is_independent_of_row_order():
    shuffled = ROWS[:]
    random.Random(3).shuffle(shuffled)
    # positions must keep the duplicate pair's input order: c1 before c2
    positions = {id(r): i for i, r in enumerate(ROWS)}
    builder = RecordBuilder()
    for record in shuffled:
        builder.add(record, positions[id(record)])
    check_expected(as_records(compute_timeline(builder.table(), GAMMA, reward_horizon=2)))


def test_reward_horizon_unbounded_and_zero():
    table = canonical([row("m", s, {}, "L", float(s)) for s in (0, 1, 2, 3)])
    unbounded = as_records(compute_timeline(table, 1.0, reward_horizon=-1))
    assert unbounded[0]["reward_timeline"] == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0}
    assert unbounded[2]["reward_timeline"] == {0: 2.0, 1: 3.0}
    assert [r["episode_value"] for r in unbounded] == [6.0, 6.0, 5.0, 3.0]
    zero = as_records(compute_timeline(table, 1.0, reward_horizon=0))
    assert [r["reward_timeline"] for r in zero] == [{0: 0.0}, {0: 1.0}, {0: 2.0}, {0: 3.0}]
    with pytest.raises(ValueError, match="gamma"):
        compute_timeline(table, 1.5)


def test_discounted_values_matches_a_reverse_loop():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=1000)
    discounts = rng.uniform(0.0, 1.0, size=1000)
    discounts[rng.random(1000) < 0.05] = 0.0  # MDP ends
    discounts[-1] = 0.0
    expected = np.zeros(1000)
    following = 0.0
    for i in range(999, -1, -1):
        following = rewards[i] + discounts[i] * following
        expected[i] = following
    np.testing.assert_allclose(discounted_values(rewards, discounts), expected, rtol=1e-12)


def test_gamma_zero_and_large_sequence_gaps():
    # timestamps far apart: gamma ** gap underflows to 0 without overflow or NaN
    table = canonical([row("m", 1_600_000_000 + 10 ** 6 * k, {}, "L", 1.0) for k in range(3)])
    values = [r["episode_value"] for r in as_records(compute_timeline(table, 0.99))]
    assert values == [1.0, 1.0, 1.0]
    values = [r["episode_value"] for r in as_records(compute_timeline(canonical(ROWS[:4]), 0.0))]
    assert values == [1.0, 2.0, 3.0, 4.0]


def test_metric_rewards_and_parametric_actions():
    rows = [
        {"mdp_id": 7, "sequence_number": "2", "state_features": {"1": 0.5},
         "action": {"speed": 1.5}, "action_probability": 0.2,
         "reward": {"clicks": 1, "revenue": 2.5}, "possible_actions": [{"speed": 1.5}, {}]},
        {"mdp_id": 7, "sequence_number": 4.0, "state_features": {"1": 0.7},
         "action": {"speed": -1.0}, "action_probability": 0.4,
         "reward": {"clicks": 0, "revenue": 4.0}},
    ]
    records = as_records(compute_timeline(canonical(rows, "revenue"), 0.5))
    first, last = records
    assert first["mdp_id"] == "7" and first["sequence_number"] == 2
    assert first["reward"] == 2.5 and first["metrics"] == {"clicks": 1.0, "revenue": 2.5}
    assert first["next_action"] == {"speed": -1.0}
    assert first["possible_next_actions"] is None  # the next row logged none
    assert first["episode_value"] == 2.5 + 0.25 * 4.0
    assert last["next_action"] == {} and last["possible_next_actions"] == []


def write_split(tmp_path, rows, seed=0):
    """``rows`` shuffled (keeping the duplicate pair's order) over a JSON-lines, a CSV
    and a Parquet file."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    first, second = order.index(5), order.index(6)  # c1 must stay before c2 in input order
    if first > second:
        order[first], order[second] = order[second], order[first]
    files = {"1.jsonl": [], "2.csv": [], "3.parquet": []}
    names = list(files)
    for k, index in enumerate(order):
        files[names[k % 3] if index not in (5, 6) else names[0]].append(rows[index])
    for name, part in files.items():
        write_logged_rows(part, tmp_path / "in" / name)
    return tmp_path / "in"


def test_run_single_worker_matches_hand_computed(tmp_path):
    inputs = write_split(tmp_path, ROWS)
    metadata = run_timeline(inputs, tmp_path / "out", GAMMA, reward_horizon=2)
    check_expected(as_records(read_table(tmp_path / "out")))
    assert metadata["rows"] == 8 and metadata["mdps"] == 3
    assert metadata["duplicate_sequence_numbers"] == 1
    assert metadata["state_features"] == ["f0", "f1"]
    assert metadata["actions"] == ["L", "R", "x", "y"]
    assert read_metadata(tmp_path / "out") == metadata
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert leftovers == ["in", "out"]  # no temporary or scratch directory left
    assert not (tmp_path / "out" / "_scratch").exists()


def test_sharded_run_equals_single_worker(tmp_path):
    rng = np.random.default_rng(5)
    rows = []
    for mdp in range(40):
        seqs = np.sort(rng.choice(1000, size=int(rng.integers(1, 12)), replace=False))
        for seq in seqs:
            features = {str(f): float(rng.normal()) for f in range(4) if rng.random() < 0.7}
            rows.append(row(f"m{mdp}", int(seq), features, str(int(rng.integers(3))),
                            float(rng.normal()), float(rng.uniform(0.1, 1.0)), ["0", "1", "2"]))
    random.Random(1).shuffle(rows)
    thirds = len(rows) // 3
    write_logged_rows(rows[:thirds], tmp_path / "in" / "a.jsonl")
    write_logged_rows(rows[thirds:2 * thirds], tmp_path / "in" / "b.csv")
    write_logged_rows(rows[2 * thirds:], tmp_path / "in" / "c.parquet")
    single = run_timeline(tmp_path / "in", tmp_path / "single", 0.9)
    # several chunks per text file, several shards, two workers
    sharded = run_timeline(tmp_path / "in", tmp_path / "sharded", 0.9, workers=2, shards=5,
                           chunk_bytes=2048)
    assert len(sharded["shards"]) > 1
    assert sharded["rows"] == single["rows"] == len(rows)
    assert sharded["mdps"] == single["mdps"] == 40
    one = as_records(read_table(tmp_path / "single"))
    many = as_records(read_table(tmp_path / "sharded"))
    assert one == many


def test_every_format_gives_the_same_timeline(tmp_path):
    results = []
    for suffix in ("jsonl", "csv", "parquet"):
        write_logged_rows(ROWS, tmp_path / f"rows.{suffix}")
        run_timeline(tmp_path / f"rows.{suffix}", tmp_path / f"out-{suffix}", GAMMA,
                     reward_horizon=2)
        results.append(as_records(read_table(tmp_path / f"out-{suffix}")))
    check_expected(results[0])
    assert results[0] == results[1] == results[2]


def test_shard_of_is_stable_and_spreads():
    ids = pa.array([f"mdp-{i}" for i in range(1000)])
    shards = shard_of(ids, 4)
    assert np.array_equal(shards, shard_of(ids, 4))
    assert np.bincount(shards, minlength=4).min() > 150
    import zlib
    assert shards[0] == zlib.crc32(b"mdp-0") % 4


def test_output_marker_is_written_last(tmp_path):
    write_logged_rows(ROWS, tmp_path / "rows.jsonl")
    run_timeline(tmp_path / "rows.jsonl", tmp_path / "out", GAMMA)
    assert (tmp_path / "out" / SUCCESS).is_file()
    with pytest.raises(FileExistsError):
        run_timeline(tmp_path / "rows.jsonl", tmp_path / "out", GAMMA)
    run_timeline(tmp_path / "rows.jsonl", tmp_path / "out", 0.0, overwrite=True)
    values = sorted(r["episode_value"] for r in read_table(tmp_path / "out").to_pylist())
    assert values[-1] == 7.0 and read_metadata(tmp_path / "out")["gamma"] == 0.0
