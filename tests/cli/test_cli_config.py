"""Configuration: environment beats file beats defaults; every bad value is one clear line."""
from __future__ import annotations

from pathlib import Path

import pytest

from cake_cli.config import ConfigError, load_settings
from cake_core.errors import CakeError


def test_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv("CAKE_HOME")
    s = load_settings()
    assert s.home == tmp_path / ".cake"
    assert s.warehouse_root == tmp_path / ".cake" / "warehouse"
    assert s.cache_dir == tmp_path / ".cake" / "cache"
    assert s.logs_dir == tmp_path / ".cake" / "logs"
    assert (s.prefect_api_url, s.prefect_host, s.prefect_port) == (None, "127.0.0.1", 4200)
    assert (s.ray_address, s.gpu, s.llm_api_key_env) == (None, "auto", "OPENAI_API_KEY")
    assert s.workers >= 1


def test_bad_port_in_env_names_setting_source_value_and_range(monkeypatch):
    monkeypatch.setenv("CAKE_PREFECT_PORT", "70000")
    with pytest.raises(ConfigError) as e:
        load_settings()
    msg = str(e.value)
    assert msg == ("setting prefect_port = '70000' (from environment variable CAKE_PREFECT_PORT) "
                   "is not allowed: expected an integer from 1 to 65535")
    assert isinstance(e.value, CakeError)


def test_bad_gpu_in_file_names_the_file(tmp_path):
    (tmp_path / "cake.toml").write_text('gpu = "sometimes"\nprefect_port = 4300\n')
    with pytest.raises(ConfigError) as e:
        load_settings()
    msg = str(e.value)
    assert "\n" not in msg
    assert f"from {tmp_path / 'cake.toml'}" in msg
    assert "gpu = 'sometimes'" in msg and "one of auto, off, require" in msg


def test_unknown_key_in_file_is_rejected_by_name(tmp_path):
    (tmp_path / "cake.toml").write_text('gpus = "off"\nprefect_prot = 1\nworkers = 2\n')
    with pytest.raises(ConfigError) as e:
        load_settings()
    msg = str(e.value)
    assert "\n" not in msg
    assert "unknown setting(s) gpus, prefect_prot" in msg and str(tmp_path / "cake.toml") in msg
    assert "allowed: home, prefect_api_url" in msg


def test_env_overrides_file_and_file_overrides_default(tmp_path, monkeypatch):
    (tmp_path / "cake.toml").write_text('prefect_port = 5000\ngpu = "off"\nworkers = 3\n')
    monkeypatch.setenv("CAKE_PREFECT_PORT", "5001")
    s = load_settings()
    assert (s.prefect_port, s.gpu, s.workers) == (5001, "off", 3)


def test_config_env_names_the_file(tmp_path, monkeypatch):
    cfg = tmp_path / "elsewhere.toml"
    cfg.write_text('ray_address = "10.0.0.1:6379"\nhome = "/tmp/x"\n')
    monkeypatch.setenv("CAKE_CONFIG", str(cfg))
    monkeypatch.delenv("CAKE_HOME")
    s = load_settings()
    assert s.ray_address == "10.0.0.1:6379" and s.home == Path("/tmp/x")


def test_missing_named_file_and_bad_toml(tmp_path, monkeypatch):
    monkeypatch.setenv("CAKE_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match=r"nope.toml \(named by CAKE_CONFIG\) does not exist"):
        load_settings()
    monkeypatch.delenv("CAKE_CONFIG")
    (tmp_path / "cake.toml").write_text("gpu = \n")
    with pytest.raises(ConfigError, match=r"cake.toml is not valid TOML"):
        load_settings()
    (tmp_path / "cake.toml").write_bytes(b"\xff\xfegpu = 'off'\n")
    with pytest.raises(ConfigError, match=r"cake.toml is not UTF-8 text"):
        load_settings()
    (tmp_path / "cake.toml").unlink()
    (tmp_path / "cake.toml").mkdir()
    with pytest.raises(ConfigError, match=r"cake.toml is not a file \(a directory\?\)"):
        load_settings()


def test_empty_env_counts_as_unset_and_urls_are_checked(monkeypatch):
    monkeypatch.setenv("CAKE_PREFECT_API_URL", "")
    assert load_settings().prefect_api_url is None
    monkeypatch.setenv("CAKE_PREFECT_API_URL", "http://h:4200/api/")
    assert load_settings().prefect_api_url == "http://h:4200/api"
    monkeypatch.setenv("CAKE_PREFECT_API_URL", "h:4200")
    with pytest.raises(ConfigError, match="CAKE_PREFECT_API_URL"):
        load_settings()


def test_several_bad_values_are_all_reported_on_one_line(monkeypatch):
    monkeypatch.setenv("CAKE_WORKERS", "0")
    monkeypatch.setenv("CAKE_GPU", "yes")
    with pytest.raises(ConfigError) as e:
        load_settings()
    msg = str(e.value)
    assert "\n" not in msg and "CAKE_WORKERS" in msg and "CAKE_GPU" in msg
