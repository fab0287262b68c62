"""The command line: per-command usage on errors naming the unknown flag, --version, help
for every flag, bundled node names, and the log level."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agents import __version__
from agents.cli import main
from agents.command_line import (
    DEFAULT_POD_RESOURCES_SOCKET,
    LOG_LEVEL_ENV,
    build_parser,
    parse_args,
)
from agents.sim.bundled import bundled_nodes


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("command", ["run", "topo", "demo"])
def test_unknown_flag_after_a_command_prints_that_commands_usage_and_exits_2(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--no-such-flag"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: node-agent {command} ")
    assert "unrecognized arguments: --no-such-flag" in err


def test_version_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"node-agent {__version__}"


def test_every_flag_of_every_command_has_help() -> None:
    parser = build_parser()
    for name, command in {"": parser, **subcommands(parser)}.items():
        for action in command._actions:
            assert action.help, f"node-agent {name} {action.option_strings or action.dest}"


def test_pod_resources_socket_defaults_to_the_kubelets_and_can_be_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NODE_AGENT_POD_RESOURCES_SOCKET")  # tests/conftest.py sets it
    assert parse_args(["run"]).pod_resources_socket == Path(DEFAULT_POD_RESOURCES_SOCKET)
    assert DEFAULT_POD_RESOURCES_SOCKET == "/var/lib/kubelet/pod-resources/kubelet.sock"
    opts = parse_args(["run", "--pod-resources-socket", "/run/pr.sock"])
    assert opts.pod_resources_socket == Path("/run/pr.sock")
    monkeypatch.setenv("NODE_AGENT_POD_RESOURCES_SOCKET", "/run/env.sock")
    assert parse_args(["run"]).pod_resources_socket == Path("/run/env.sock")
    opts = parse_args(["run", "--pod-resources-socket", "/run/pr.sock"])
    assert opts.pod_resources_socket == Path("/run/pr.sock")  # the flag wins


def test_kubeconfig_and_node_name_flags_are_read() -> None:
    opts = parse_args(["run", "--kubeconfig", "/etc/k.yaml", "--node-name", "n7"])
    assert (opts.kubeconfig, opts.node_name) == (Path("/etc/k.yaml"), "n7")
    opts = parse_args(["run"])
    assert (opts.kubeconfig, opts.node_name) == (None, None)


def test_simulate_root_without_simulate_is_a_usage_error_of_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--simulate-root", "/var/lib/node-agent-sim"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: node-agent run ")
    assert err.rstrip().endswith("--simulate-root: only with --simulate")


def test_simulate_root_is_made_absolute_and_off_by_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert parse_args(["run", "--simulate", "h100-8gpu-8nic"]).simulate_root is None
    monkeypatch.chdir(tmp_path)
    opts = parse_args(["run", "--simulate", "h100-8gpu-8nic", "--simulate-root", "sim"])
    assert opts.simulate_root == tmp_path / "sim"


@pytest.mark.parametrize("argv", [["--bogus"], ["--bogus", "run"], ["-x", "topo", "--json"]])
def test_unknown_flag_before_the_command_is_named_and_exits_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: node-agent [-h]")
    assert err.rstrip().endswith(f"node-agent: error: unrecognized arguments: {argv[0]}")


@pytest.mark.parametrize("command", ["run", "topo"])
def test_simulate_name_that_is_neither_file_nor_bundled_node_lists_the_bundled_ones(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--simulate", "h100-8gpu-8nix"])
    assert exited.value.code == 2
    (last,) = capsys.readouterr().err.splitlines()[-1:]
    assert last == (
        f"node-agent {command}: error: argument --simulate: h100-8gpu-8nix: no such file, "
        f"nor a bundled node (bundled: {', '.join(bundled_nodes())})"
    )
    assert "h100-8gpu-8nic" in bundled_nodes()


def test_log_level_defaults_to_info_and_the_flag_wins_over_the_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(LOG_LEVEL_ENV, raising=False)
    assert parse_args(["run"]).log_level == "info"
    monkeypatch.setenv(LOG_LEVEL_ENV, "error")
    assert parse_args(["run"]).log_level == "error"
    assert parse_args(["run", "--log-level", "debug"]).log_level == "debug"


def test_log_level_env_outside_the_levels_is_a_usage_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(LOG_LEVEL_ENV, "loud")
    with pytest.raises(SystemExit) as exited:
        main(["run"])
    assert exited.value.code == 2
    assert (
        capsys.readouterr()
        .err.rstrip()
        .endswith(f"{LOG_LEVEL_ENV}: one of debug, info, warning, error, not 'loud'")
    )


def test_dra_evict_unhealthy_without_device_taints_is_a_usage_error_of_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["run", "--api", "dra", "--dra-evict-unhealthy"])
    assert exited.value.code == 2
    assert "--dra-evict-unhealthy: only with --dra-device-taints" in capsys.readouterr().err
    opts = parse_args(["run", "--api", "dra", "--dra-device-taints", "--dra-evict-unhealthy"])
    assert opts.dra_evict_unhealthy and opts.dra_device_taints
    assert not parse_args(["run"]).dra_evict_unhealthy
