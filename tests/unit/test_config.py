"""Configuration: flag > env > file > default, one sentence for a bad value, defaults file in step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from blackbox.config import RUN_OPTIONS, load_run_config
from blackbox.errors import BlackboxError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_precedence(tmp_path: Path) -> None:
    cfg_file = tmp_path / "bb.toml"
    cfg_file.write_text('[run]\nstall_timeout = 30\npoll_interval = 2\non_stall = "keep"\n')
    env = {"BLACKBOX_STALL_TIMEOUT": "20", "BLACKBOX_POLL_INTERVAL": "3"}
    c = load_run_config({"stall_timeout": "10"}, env, str(cfg_file))
    assert c.stall_timeout == 10.0 and c.sources["stall_timeout"] == "flag"
    assert c.poll_interval == 3.0 and c.sources["poll_interval"] == "env"
    assert c.on_stall == "keep" and c.sources["on_stall"] == "file"
    assert c.kill_grace == 30.0 and c.sources["kill_grace"] == "default"


def test_config_file_from_env(tmp_path: Path) -> None:
    cfg_file = tmp_path / "bb.toml"
    cfg_file.write_text("[run]\nfrozen_timeout = 9\n")
    assert load_run_config({}, {"BLACKBOX_CONFIG": str(cfg_file)}).frozen_timeout == 9.0


@pytest.mark.parametrize(
    ("flags", "env", "needle"),
    [
        (
            {"stall_timeout": "soon"},
            {},
            "`--stall-timeout` must be a number of seconds or `auto`, not `soon`.",
        ),
        ({}, {"BLACKBOX_POLL_INTERVAL": "-1"}, "`BLACKBOX_POLL_INTERVAL` must be a number of seconds"),
        ({"on_stall": "maybe"}, {}, "`--on-stall` must be `kill` or `keep`, not `maybe`."),
    ],
)
def test_bad_values_name_their_source(flags: dict[str, str], env: dict[str, str], needle: str) -> None:
    with pytest.raises(BlackboxError) as info:
        load_run_config(flags, env)
    assert needle in info.value.message


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(BlackboxError, match="does not exist"):
        load_run_config({}, {}, str(tmp_path / "missing.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\n")
    with pytest.raises(BlackboxError, match="not valid TOML"):
        load_run_config({}, {}, str(bad))
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[run]\nstal_timeout = 5\n")
    with pytest.raises(BlackboxError, match="unknown option"):
        load_run_config({}, {}, str(unknown))


def test_default_file_matches_the_code() -> None:
    with open(ROOT / "configs" / "default.toml", "rb") as f:
        file_values = tomllib.load(f)["run"]
    defaults = {o.name: o.default for o in RUN_OPTIONS if o.default is not None}
    assert file_values == defaults
