"""`run --config-dir DIR [--config-default NAME] [--config-label KEY]`: flags or their
environment variables, and never together with --config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.cli import main
from agents.command_line import CONFIG_DEFAULT_ENV, CONFIG_DIR_ENV, CONFIG_LABEL_ENV, parse_args

ENVS = (CONFIG_DIR_ENV, CONFIG_DEFAULT_ENV, CONFIG_LABEL_ENV)


@pytest.fixture(autouse=True)
def no_config_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENVS:
        monkeypatch.delenv(name, raising=False)


def test_config_dir_flags_are_read_and_the_label_defaults_to_nvidias() -> None:
    opts = parse_args(["run", "--config-dir", "/etc/c", "--config-default", "ts4"])
    assert (opts.config_dir, opts.config_default) == (Path("/etc/c"), "ts4")
    assert opts.config_label == "nvidia.com/device-plugin.config"
    opts = parse_args(["run", "--config-dir", "/etc/c", "--config-label", "example.com/cfg"])
    assert (opts.config_default, opts.config_label) == (None, "example.com/cfg")


def test_config_dir_flags_come_from_the_environment_and_flags_win(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(CONFIG_DIR_ENV, "/etc/env-dir")
    monkeypatch.setenv(CONFIG_DEFAULT_ENV, "env-default")
    monkeypatch.setenv(CONFIG_LABEL_ENV, "example.com/env")
    opts = parse_args(["run"])
    assert opts.config_dir == Path("/etc/env-dir")
    assert (opts.config_default, opts.config_label) == ("env-default", "example.com/env")
    opts = parse_args(["run", "--config-dir", "/etc/flag", "--config-default", "flag"])
    assert (opts.config_dir, opts.config_default) == (Path("/etc/flag"), "flag")


@pytest.mark.parametrize(
    "env", [{}, {CONFIG_DIR_ENV: "/etc/env-dir"}], ids=["flags", "dir-from-env"]
)
def test_config_and_config_dir_together_exit_2_naming_both(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = ["run", "--config", "/etc/c.yaml"] + ([] if env else ["--config-dir", "/etc/c"])
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: node-agent run ")
    assert "--config and --config-dir" in err


@pytest.mark.parametrize("flag", ["--config-default", "--config-label"])
def test_a_config_dir_companion_without_config_dir_is_a_usage_error(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", flag, "x"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(f"{flag}: only with --config-dir")


def test_a_default_that_names_no_config_exits_2_naming_the_configs_there(
    tmp_path: Path,
) -> None:
    (tmp_path / "default.yaml").write_text("version: v1\n")
    (tmp_path / "ts4").write_text("version: v1\n")
    (tmp_path / "dp").mkdir()
    argv = ["run", "--config-dir", str(tmp_path), "--config-default", "dflt"]
    argv += ["--device-plugin-dir", str(tmp_path / "dp"), "--simulate", "h100-8gpu-8nic"]
    # A process of its own: `run` configures logging and signals for the whole process.
    env = {k: v for k, v in os.environ.items() if k not in {*ENVS, "NODE_NAME"}}
    done = subprocess.run(
        [sys.executable, "-m", "agents.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 2
    assert f"node-agent: {tmp_path}: --config-default: " in done.stderr
    assert "(default, ts4), got 'dflt'" in done.stderr
    assert not any((tmp_path / "dp").iterdir())
