"""Configuration precedence, validation, and the command line."""
import json
import logging
import subprocess
import sys

import pytest

import fiberrl
from fiberrl import config
from fiberrl.errors import ConfigError
from fiberrl.resources import parse_mem


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for key in list(__import__("os").environ):
        if key.startswith("FIBERRL_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def test_defaults():
    cfg = config.resolve()
    assert cfg.backend == "local" and cfg.gpu == 0 and cfg.cpu is None


def test_precedence_init_over_env_over_file_over_defaults(tmp_path, monkeypatch):
    (tmp_path / "fiberrl.toml").write_text('backend = "file"\ncpu = 3\nlog_level = "INFO"\n')
    cfg = config.resolve()
    assert (cfg.backend, cfg.cpu, cfg.log_level) == ("file", 3.0, "INFO")
    monkeypatch.setenv("FIBERRL_BACKEND", "env")
    monkeypatch.setenv("FIBERRL_CPU", "2.5")
    cfg = config.resolve()
    assert (cfg.backend, cfg.cpu, cfg.log_level) == ("env", 2.5, "INFO")
    cfg = config.resolve(backend="arg")
    assert (cfg.backend, cfg.cpu) == ("arg", 2.5)


def test_config_file_from_env_var_and_fiberrl_table(tmp_path, monkeypatch):
    path = tmp_path / "elsewhere.toml"
    path.write_text('[fiberrl]\nmem = "2G"\nextra = {slurm_partition = "gpu"}\n')
    monkeypatch.setenv("FIBERRL_CONFIG", str(path))
    cfg = config.resolve()
    assert cfg.mem == "2G" and cfg.extra == {"slurm_partition": "gpu"}


def test_unknown_keys_list_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match="valid keys: backend"):
        config.resolve(bakend="local")
    (tmp_path / "fiberrl.toml").write_text("nonsense = 1\n")
    with pytest.raises(ConfigError, match="nonsense"):
        config.resolve()


def test_bad_values_are_clear(monkeypatch):
    monkeypatch.setenv("FIBERRL_START_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="start_timeout"):
        config.resolve()


def test_an_unknown_log_level_is_refused_where_it_is_set(monkeypatch):
    """Before, a job's logging set-up raised on it, so every worker died with a
    traceback; now the process that reads the setting says which value is wrong."""
    monkeypatch.setenv("FIBERRL_LOG_LEVEL", "bogus")
    with pytest.raises(ConfigError, match="log_level.*'bogus'.*DEBUG"):
        config.resolve()
    for given, name in (("debug", "debug"), ("Warning", "Warning"), ("WARN", "WARN"),
                        ("10", "DEBUG")):
        monkeypatch.setenv("FIBERRL_LOG_LEVEL", given)
        assert config.resolve().log_level == name
    assert config.resolve(log_level=logging.INFO).log_level == "INFO"   # a number, as Fiber's


def test_memory_sizes_read_the_usual_spellings_and_refuse_others():
    """Checked when set (a bad one failed every job start before); Kubernetes' "2Gi"
    reads as "2G" does."""
    for given, size in (("512M", 512 << 20), ("2G", 2 << 30), ("2Gi", 2 << 30),
                        ("2GiB", 2 << 30), ("1.5g", 3 << 29), ("4096", 4096), (4096, 4096)):
        assert parse_mem(config.resolve(mem=given).mem) == size, given
    for bad in ("lots", "-1", "2i", "2 GB of RAM"):
        with pytest.raises(ConfigError, match="mem"):
            config.resolve(mem=bad)


def test_switches_read_the_usual_spellings_and_refuse_others():
    for given, value in (("yes", True), ("On", True), ("1", True), (True, True),
                         ("no", False), ("off", False), ("0", False), (False, False)):
        assert config.resolve(forkserver=given).forkserver is value
    with pytest.raises(ConfigError, match="forkserver.*'maybe'"):
        config.resolve(forkserver="maybe")


def test_children_inherit_the_resolved_config(monkeypatch):
    parent = config.resolve(backend="local", cpu=4)
    monkeypatch.setenv(config.INHERITED_ENV, parent.to_json())
    monkeypatch.setenv("FIBERRL_CPU", "1")  # the parent's view wins in a job
    assert config.resolve().cpu == 4


def test_unknown_backend_is_named():
    from fiberrl.backends import get_backend
    with pytest.raises(ConfigError, match="unknown fiberrl backend 'nope'.*local"):
        get_backend("nope")


def test_cli_lists_backends_and_runs_cpe(tmp_path):
    out = subprocess.run([sys.executable, "-m", "fiberrl.cli", "backends"],
                         capture_output=True, text=True, check=True).stdout
    assert "* local" in out
    rows = [{"action": a, "reward": float(a), "logged_propensity": 0.5,
             "target_probs": [0.0, 1.0]} for a in (0, 1) * 50]
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    result = subprocess.run([sys.executable, "-m", "fiberrl.cli", "cpe", "evaluate", str(path),
                             "--json", "--n-bootstrap", "20", "--seed", "0"],
                            capture_output=True, text=True, check=True)
    report = json.loads(result.stdout)
    assert report["estimates"]["ips"]["value"] == pytest.approx(1.0)  # target always plays 1
    assert report["estimates"]["ips"]["normalized"] == pytest.approx(2.0)


@pytest.fixture
def restore_config():
    yield
    config.reset()


def test_init_updates_the_settings_instead_of_replacing_them(restore_config):
    import fiberrl
    fiberrl.init(cpu=2, backend="local")
    fiberrl.init(log_level="INFO")
    cfg = config.get_config()
    assert (cfg.cpu, cfg.log_level, cfg.backend) == (2.0, "INFO", "local")
    assert config.is_explicit(cfg, "backend")   # inside a Slurm allocation: stays local
    fiberrl.set_executable(sys.executable)
    assert config.get_config().cpu == 2.0 and config.get_config().python == sys.executable
    config.reset()
    assert config.get_config().cpu is None


@pytest.mark.parametrize("bad", [{"backend": "nosuch"}, {"start_timeout": -1},
                                 {"heartbeat_interval": 0}, {"parent_grace": -0.5},
                                 {"cpu": 0}, {"max_task_retries": -1}, {"log_level": "verbose"},
                                 {"mem": "lots"}, {"mem": -1}, {"forkserver": "maybe"},
                                 {"spin_wait_us": float("nan")}, {"cpu": float("inf")}])
def test_bad_settings_are_refused_at_init_and_change_nothing(restore_config, bad):
    import fiberrl
    fiberrl.init(cpu=3)
    with pytest.raises(ConfigError, match=next(iter(bad))):
        fiberrl.init(**bad)
    assert config.get_config().cpu == 3.0 and config.get_config().backend == "local"


def test_an_unknown_fiberrl_environment_variable_is_reported(monkeypatch, caplog):
    monkeypatch.setenv("FIBERRL_BAKEND", "slurm")
    with caplog.at_level("WARNING", logger="fiberrl.config"):
        config.resolve()
    assert "FIBERRL_BAKEND" in caplog.text and "FIBERRL_BACKEND" in caplog.text


def test_resolving_evaluates_the_field_types_once(monkeypatch):
    """Every job resolves its inherited configuration at start; evaluating Config's
    string annotations once per key cost each job ~10 ms (start+join was slower than
    the stdlib's forkserver because of it)."""
    import typing
    inherited = {key: getattr(config.Config(), key) for key in config.Config.keys()}
    monkeypatch.setenv(config.INHERITED_ENV, json.dumps(inherited))
    calls = []
    real = typing.get_type_hints
    monkeypatch.setattr(typing, "get_type_hints", lambda *a, **k: calls.append(a) or real(*a, **k))
    config.field_types.cache_clear()
    for _ in range(3):
        assert config.resolve() == config.resolve()
    assert len(calls) == 1


def test_code_that_uses_the_config_module_travels_by_value():
    """Functions sent by value carry the modules they use by name; this module is of a
    ModuleType subclass (for Fiber's ``fiber.config.<key>``), which pickle and cloudpickle
    do not find a reducer for unless it gives its own."""
    import pickle
    from fiberrl import reduction
    sent = lambda: fiberrl.config.get_config().backend   # noqa: E731 - by value
    assert reduction.loads(reduction.dumps(sent))() == "local"
    assert pickle.loads(pickle.dumps(fiberrl.config)) is fiberrl.config
