"""``python -m cpe evaluate FILE`` on real JSON-lines, CSV and Parquet files."""

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cpe
from cpe import cli
from cpe_problems import ContextualBandit, SmallMDP

ROOT = Path(__file__).resolve().parents[2]


def _bandit_records(n=200, with_model=True):
    log = ContextualBandit.make(seed=0).sample(n, np.random.default_rng(0))
    records = []
    for i in range(n):
        record = {"action": int(log.actions[i]), "reward": float(log.rewards[i]),
                  "logged_propensity": float(log.logged_propensities[i]),
                  "target_probs": log.target_probs[i].tolist()}
        if with_model:
            record["reward_estimates"] = log.reward_estimates[i].tolist()
        records.append(record)
    return log, records


def _trajectory_records(n_episodes=60):
    traj = SmallMDP.make(seed=1).sample(n_episodes, np.random.default_rng(1))
    records = [{"mdp_id": f"ep{traj.mdp_ids[i]}", "sequence_number": int(traj.sequence_numbers[i]),
                "action": int(traj.actions[i]), "reward": float(traj.rewards[i]),
                "logged_propensity": float(traj.logged_propensities[i]),
                "target_probs": traj.target_probs[i].tolist(),
                "q_estimates": traj.q_estimates[i].tolist()} for i in range(traj.n)]
    return traj, records


def _write_jsonl(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def _write_csv(path, records):
    fields = list(records[0])
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for r in records:
            writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()})
    return path


def _run_json(capsys, *argv):
    assert cli.run(["evaluate", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_bandit_jsonl_matches_api(tmp_path, capsys):
    log, records = _bandit_records()
    path = _write_jsonl(tmp_path / "log.jsonl", records)
    out = _run_json(capsys, path, "--seed", 3, "--n-bootstrap", 50)
    expected = cpe.evaluate(log, n_bootstrap=50, seed=3)
    assert out["kind"] == "bandit" and list(out["estimates"]) == ["ips", "snips", "dm", "dr"]
    for name, est in expected.items():
        assert out["estimates"][name]["value"] == pytest.approx(est.value)
        assert out["estimates"][name]["ci_low"] == pytest.approx(est.ci_low)


def test_bandit_table_output(tmp_path, capsys):
    _, records = _bandit_records(with_model=False)
    path = _write_jsonl(tmp_path / "log.jsonl", records)
    assert cli.run(["evaluate", str(path), "--seed", "0", "--n-bootstrap", "20"]) == 0
    out = capsys.readouterr().out
    assert "95% CI" in out and "snips" in out and "dr" not in out.split()


def test_trajectories_csv_detected_by_mdp_id(tmp_path, capsys):
    traj, records = _trajectory_records()
    path = _write_csv(tmp_path / "episodes.csv", records)
    out = _run_json(capsys, path, "--gamma", 0.9, "--seed", 1, "--n-bootstrap", 20,
                    "--estimators", "is,wdr,magic")
    assert out["kind"] == "trajectories" and out["n"] == 60
    assert list(out["estimates"]) == ["is", "wdr", "magic"]
    expected = cpe.evaluate(traj, ["is", "wdr", "magic"], n_bootstrap=20, seed=1)
    for name, est in expected.items():
        assert out["estimates"][name]["value"] == pytest.approx(est.value)
    assert "magic" in out["diagnostics"]


def test_parquet_and_json_array(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    traj, records = _trajectory_records(30)
    table = pa.Table.from_pylist(records)
    pq.write_table(table, tmp_path / "episodes.parquet")
    out = _run_json(capsys, tmp_path / "episodes.parquet", "--gamma", 0.9, "--n-bootstrap", 0)
    expected = cpe.evaluate(traj, n_bootstrap=0)
    assert out["estimates"]["dr"]["value"] == pytest.approx(expected["dr"].value)
    assert out["estimates"]["dr"]["stderr"] is None  # NaN becomes null in strict JSON

    (tmp_path / "episodes.json").write_text(json.dumps(records))
    out2 = _run_json(capsys, tmp_path / "episodes.json", "--gamma", 0.9, "--n-bootstrap", 0)
    assert out2["estimates"] == out["estimates"]


def test_load_gives_data_objects(tmp_path):
    _, records = _bandit_records(20)
    log = cpe.load(_write_jsonl(tmp_path / "a.ndjson", records))
    assert isinstance(log, cpe.BanditLog) and log.n == 20 and log.has_model
    _, traj_records = _trajectory_records(5)
    traj = cpe.load(_write_csv(tmp_path / "t.txt", traj_records), format="csv", gamma=0.5)
    assert isinstance(traj, cpe.Trajectories) and traj.gamma == 0.5


@pytest.mark.parametrize("content, message", [
    ('{"action": 0, "reward": 1, "target_probs": [1.0]}\n', "missing required field.*action_probability"),
    ('{"action": 0, "reward": 1, "logged_propensity": 0, "target_probs": [1.0]}\n', "zero propensity"),
    ('{"action": 0, "reward": 1, "logged_propensity": 1, "target_probs": [1.0]}\n'
     '{"action": 0, "reward": 1, "logged_propensity": 1, "target_probs": [0.5, 0.5]}\n', "different lengths"),
    ('{"action": 0, "reward": 1, "logged_propensity": 1, "target_probs": [1.0], "reward_estimates": [1]}\n'
     '{"action": 0, "reward": 1, "logged_propensity": 1, "target_probs": [1.0]}\n', "line 2: missing field 'reward_estimates'"),
    ("not json\n", "line 1: invalid JSON"),
    ("\n", "no records"),
])
def test_bad_files_report_errors(tmp_path, capsys, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    assert cli.run(["evaluate", str(path)]) == 2
    assert message.split(".*")[-1] in capsys.readouterr().err
    with pytest.raises(ValueError, match=message):
        cpe.load(path)


def test_unknown_suffix_missing_file_and_bad_estimator(tmp_path, capsys):
    (tmp_path / "x.xlsx").write_text("")
    assert cli.run(["evaluate", str(tmp_path / "x.xlsx")]) == 2
    assert "cannot tell the format" in capsys.readouterr().err
    assert cli.run(["evaluate", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    _, records = _bandit_records(10)
    path = _write_jsonl(tmp_path / "log.jsonl", records)
    assert cli.run(["evaluate", str(path), "--estimators", "ips,wdr"]) == 2
    assert "valid: ips, snips, dm, dr" in capsys.readouterr().err


def test_register_adds_cpe_evaluate_to_a_host_parser(tmp_path, capsys):
    _, records = _bandit_records(30)
    path = _write_jsonl(tmp_path / "log.jsonl", records)
    host = argparse.ArgumentParser(prog="fiberrl")
    commands = host.add_subparsers(dest="command")
    cli.register(commands)
    args = host.parse_args(["cpe", "evaluate", str(path), "--n-bootstrap", "10", "--seed", "0"])
    assert args.command == "cpe" and args.cpe_command == "evaluate"
    assert args.func(args) == 0
    assert "ips" in capsys.readouterr().out


def test_add_arguments_on_a_plain_parser(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    _, records = _bandit_records(30)
    args = parser.parse_args([str(_write_jsonl(tmp_path / "l.jsonl", records)), "--json",
                              "--n-bootstrap", "0"])
    assert cli.main(args) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 30


def test_python_dash_m_entry_point(tmp_path):
    _, records = _bandit_records(30)
    path = _write_jsonl(tmp_path / "log.jsonl", records)
    result = subprocess.run([sys.executable, "-m", "cpe", "evaluate", str(path), "--n-bootstrap",
                             "10", "--seed", "0"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "estimator" in result.stdout and "dr" in result.stdout


@pytest.fixture(scope="module")
def resource_tracker():
    """Start multiprocessing's interpreter-lifetime resource tracker before the pool test."""
    from multiprocessing import resource_tracker as tracker

    tracker.ensure_running()


def test_workers_option_uses_a_pool_with_the_same_result(resource_tracker, tmp_path, capsys,
                                                         monkeypatch):
    monkeypatch.setattr(cli, "POOL_MIN_WORK", 0)   # a pool whatever the size
    used = []
    real = cli.evaluate

    def spy(data, *args, **kwargs):
        used.append((kwargs.get("pool") is not None, kwargs.get("same_host")))
        return real(data, *args, **kwargs)
    monkeypatch.setattr(cli, "evaluate", spy)
    _, records = _bandit_records(200)
    path = _write_jsonl(tmp_path / "log.jsonl", records)
    serial = _run_json(capsys, path, "--seed", 4, "--n-bootstrap", 30)
    pooled = _run_json(capsys, path, "--seed", 4, "--n-bootstrap", 30, "--workers", 2)
    assert pooled["estimates"] == serial["estimates"]
    assert used[-1] == (True, True)   # on the pool; local: features by a shared file


def test_workers_below_the_threshold_run_in_this_process_and_say_so(tmp_path, capsys):
    _, records = _bandit_records(200)
    path = _write_jsonl(tmp_path / "log.jsonl", records)
    serial = _run_json(capsys, path, "--seed", 4, "--n-bootstrap", 30)
    assert cli.run(["evaluate", str(path), "--seed", "4", "--n-bootstrap", "30",
                    "--workers", "2", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["estimates"] == serial["estimates"]
    assert err.count("\n") == 1 and "200 rows x 30 replicates is too little work" in err


def test_workers_pay_from_the_measured_size():
    assert cli.workers_pay(50_000, 200, 2)
    assert not cli.workers_pay(49_999, 200, 2)
    assert not cli.workers_pay(10**9, 200, 1)


def test_a_missing_file_is_refused_before_workers_start(tmp_path, capsys, monkeypatch):
    started = []
    monkeypatch.setattr(cli, "_start_pool", lambda *a: started.append(a))
    assert cli.run(["evaluate", str(tmp_path / "none.jsonl"), "--workers", "2"]) == 2
    assert started == []
    assert "none.jsonl: no such file or directory" in capsys.readouterr().err
