"""Bad logged input: a clear LoggedDataError naming the file, the line or row and the
field, and no partial output left looking complete (in-process and on a pool)."""
import json
import pickle

import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from rl.data.readers import find_inputs, plan_chunks, read_chunk  # noqa: E402
from rl.data.schema import LoggedDataError  # noqa: E402
from rl.data.sharding import run_timeline  # noqa: E402
from rl.data.writers import write_logged_rows  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def good(mdp="m", seq=0, **changes):
    record = {"mdp_id": mdp, "sequence_number": seq, "state_features": {"0": 1.0},
              "action": "L", "action_probability": 0.5, "reward": 1.0}
    record.update(changes)
    return {k: v for k, v in record.items() if v is not ...}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def assert_nothing_left(tmp_path, out_name="out"):
    """No output directory and no hidden temporary directory next to it."""
    names = [p.name for p in tmp_path.iterdir()]
    assert out_name not in names
    assert not [n for n in names if n.startswith(f".{out_name}.")], names


def test_missing_mdp_id_names_file_line_and_field(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl",
                       [good(seq=0), good(seq=1), good(seq=2, mdp_id=...), good(seq=3)])
    with pytest.raises(LoggedDataError) as caught:
        run_timeline(path, tmp_path / "out", 0.9)
    error = caught.value
    assert (error.path, error.line, error.field) == (str(path), 3, "mdp_id")
    assert str(error) == f"{path}, line 3, field 'mdp_id': missing"
    assert_nothing_left(tmp_path)


def test_non_numeric_sequence_number_in_csv(tmp_path):
    path = tmp_path / "rows.csv"
    write_logged_rows([good(seq=0), good(seq=1), good(seq=2)], path)
    lines = path.read_text().splitlines()
    lines[3] = lines[3].replace("m,2,", "m,two,")  # the header is line 1
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LoggedDataError, match=r"rows\.csv, line 4, field 'sequence_number': "
                                              r"must be an integer, got non-numeric 'two'"):
        run_timeline(path, tmp_path / "out", 0.9)
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize("probability", [1.5, 0.0, -0.2])
def test_probability_outside_unit_interval_in_parquet(tmp_path, probability):
    path = tmp_path / "rows.parquet"
    write_logged_rows([good(seq=0), good(seq=1, action_probability=probability)], path)
    with pytest.raises(LoggedDataError) as caught:
        run_timeline(path, tmp_path / "out", 0.9)
    assert (caught.value.row, caught.value.field) == (2, "action_probability")
    assert f"must be in (0, 1], got {probability!r}" in str(caught.value)
    assert_nothing_left(tmp_path)


def test_error_in_a_later_chunk_on_a_pool_names_the_absolute_line(tmp_path):
    records = [good(mdp=f"m{i % 7}", seq=i) for i in range(300)]
    records[250]["action_probability"] = 2.0
    path = write_jsonl(tmp_path / "rows.jsonl", records)
    chunks = plan_chunks(find_inputs(path), chunk_bytes=4096)
    assert len(chunks) > 3
    with pytest.raises(LoggedDataError) as caught:
        run_timeline(path, tmp_path / "out", 0.9, workers=2, chunk_bytes=4096)
    assert (caught.value.line, caught.value.field) == (251, "action_probability")
    assert_nothing_left(tmp_path)


def test_failed_overwrite_keeps_the_earlier_output(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [good(seq=0), good(seq=1)])
    run_timeline(path, tmp_path / "out", 0.9)
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    write_jsonl(path, [good(seq=0), good(seq="x")])
    with pytest.raises(LoggedDataError, match="line 2"):
        run_timeline(path, tmp_path / "out", 0.9, overwrite=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


@pytest.mark.parametrize("changes, field, message", [
    ({"state_features": {"0": "high"}}, "state_features", "feature '0' must be a finite number"),
    ({"state_features": ...}, "state_features", "missing"),
    ({"action": ""}, "action", "missing"),
    ({"action": [1]}, "action", "must be a string (discrete) or an object (parametric)"),
    ({"reward": "much"}, "reward", "must be a number"),
    ({"reward": {"clicks": 1}}, "reward", "choose the reward with a reward metric"),
    ({"sequence_number": 1.5}, "sequence_number", "must be an integer"),
    ({"possible_actions": "L"}, "possible_actions", "must be a list of actions"),
    ({"mdp_id": 1.5}, "mdp_id", "must be a string or an integer"),
])
def test_field_errors_in_json_lines(tmp_path, changes, field, message):
    path = write_jsonl(tmp_path / "rows.jsonl", [good(seq=0), good(seq=1, **changes)])
    with pytest.raises(LoggedDataError) as caught:
        read_chunk(plan_chunks([path])[0])
    assert (caught.value.line, caught.value.field) == (2, field)
    assert message in str(caught.value)


def test_invalid_json_and_mixed_action_kinds(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(good()) + "\n{not json\n")
    with pytest.raises(LoggedDataError, match=r"rows\.jsonl, line 2: invalid JSON"):
        read_chunk(plan_chunks([path])[0])
    write_jsonl(path, [good(seq=0), good(seq=1, action={"x": 1.0})])
    with pytest.raises(LoggedDataError, match="line 2, field 'action': a parametric action, but "
                                              "earlier rows have discrete actions"):
        read_chunk(plan_chunks([path])[0])
    # the two kinds in different files: found after phase 1
    write_jsonl(tmp_path / "a.jsonl", [good(seq=0)])
    write_jsonl(tmp_path / "b.jsonl", [good(seq=1, action={"x": 1.0})])
    with pytest.raises(LoggedDataError, match=r"b\.jsonl, line 1, field 'action': parametric "
                                              r"actions, but .*a\.jsonl \(line 1\) has discrete"):
        run_timeline([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], tmp_path / "out", 0.9)
    assert_nothing_left(tmp_path)


def test_parquet_column_checks(tmp_path):
    path = tmp_path / "rows.parquet"
    schema = pa.schema([("mdp_id", pa.string()), ("sequence_number", pa.int64()),
                        ("state_features", pa.map_(pa.string(), pa.float64())),
                        ("action", pa.string()), ("action_probability", pa.float64()),
                        ("reward", pa.float64())])
    table = pa.table({"mdp_id": ["a", None], "sequence_number": [1, 2],
                      "state_features": [[("0", 1.0)], [("0", 2.0)]], "action": ["L", "R"],
                      "action_probability": [0.5, 0.5], "reward": [1.0, 2.0]}, schema=schema)
    pq.write_table(table, path)
    with pytest.raises(LoggedDataError, match=r"rows\.parquet, row 2, field 'mdp_id': missing"):
        read_chunk(plan_chunks([path])[0])
    pq.write_table(table.drop_columns(["reward"]), path)
    with pytest.raises(LoggedDataError, match=r"field 'reward': missing column"):
        read_chunk(plan_chunks([path])[0])
    bad = table.set_column(1, "sequence_number", pa.array(["1", "two"]))
    pq.write_table(bad.set_column(0, "mdp_id", pa.array(["a", "b"])), path)
    with pytest.raises(LoggedDataError, match="row 2, field 'sequence_number': must be an "
                                              "integer, got non-numeric 'two'"):
        read_chunk(plan_chunks([path])[0])
    nan = table.set_column(2, "state_features", pa.array([[("0", 1.0)], [("7", float("nan"))]],
                                                         pa.map_(pa.string(), pa.float64())))
    pq.write_table(nan.set_column(0, "mdp_id", pa.array(["a", "b"])), path)
    with pytest.raises(LoggedDataError, match="row 2, field 'state_features': feature '7' must "
                                              "be a finite number"):
        read_chunk(plan_chunks([path])[0])


def test_parquet_possible_actions_errors_name_the_row(tmp_path):
    path = tmp_path / "rows.parquet"
    write_logged_rows([good(seq=0, possible_actions=["L", "R"]), good(seq=1),
                       good(seq=2, possible_actions=["R", ""])], path)
    with pytest.raises(LoggedDataError, match=r"row 3, field 'possible_actions': missing"):
        read_chunk(plan_chunks([path])[0])


def test_parquet_integer_ids_struct_features_and_null_values(tmp_path):
    path = tmp_path / "rows.parquet"
    table = pa.table({
        "mdp_id": pa.array([7, 7], pa.int64()),
        "sequence_number": pa.array([3.0, 5.0]),
        "state_features": pa.array([{"a": 1, "b": None}, {"a": None, "b": 2}]),
        "action": pa.array([1, 0]),
        "action_probability": pa.array([0.5, 1.0]),
        "reward": pa.array([1, 2]),
    })
    pq.write_table(table, path)
    rows = read_chunk(plan_chunks([path])[0]).to_pylist()
    assert [r["mdp_id"] for r in rows] == ["7", "7"]
    assert [r["sequence_number"] for r in rows] == [3, 5]
    assert [r["state_features"] for r in rows] == [[("a", 1.0)], [("b", 2.0)]]
    assert [r["action"] for r in rows] == ["1", "0"]


def test_logged_data_error_pickles_with_its_fields():
    error = LoggedDataError("f.jsonl", "missing", line=3, field="mdp_id")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.path, copy.line, copy.field, str(copy)) == \
        ("f.jsonl", 3, "mdp_id", "f.jsonl, line 3, field 'mdp_id': missing")
    assert isinstance(copy, ValueError)


def test_inputs_must_exist_and_hold_rows(tmp_path):
    with pytest.raises(FileNotFoundError):
        run_timeline(tmp_path / "nope.jsonl", tmp_path / "out", 0.9)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(LoggedDataError, match="no logged rows"):
        run_timeline(tmp_path / "empty.jsonl", tmp_path / "out", 0.9)
    assert_nothing_left(tmp_path)
