"""The command line: per-command usage on errors, --version, and help for every flag."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agents import __version__
from agents.cli import DEFAULT_POD_RESOURCES_SOCKET, build_parser, main, parse_args


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


def test_pod_resources_socket_defaults_to_the_kubelets_and_can_be_set() -> None:
    assert parse_args(["run"]).pod_resources_socket == Path(DEFAULT_POD_RESOURCES_SOCKET)
    assert DEFAULT_POD_RESOURCES_SOCKET == "/var/lib/kubelet/pod-resources/kubelet.sock"
    opts = parse_args(["run", "--pod-resources-socket", "/run/pr.sock"])
    assert opts.pod_resources_socket == Path("/run/pr.sock")


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
