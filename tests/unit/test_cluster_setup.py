"""Which node and which API server the reports go to, and when there are none."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from agents.cluster import cluster_reporter
from tests.standin.apiserver import write_kubeconfig


async def test_env_node_name_comes_first_then_the_flag(tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path / "k", "http://127.0.0.1:1")
    reporter = await cluster_reporter(config, "from-flag", {"NODE_NAME": "from-env"})
    assert reporter is not None and reporter.node == "from-env"
    reporter = await cluster_reporter(config, "from-flag", {})
    assert reporter is not None and reporter.node == "from-flag"


async def test_no_node_name_is_one_line_and_no_reporter(tmp_path: Path) -> None:
    with capture_logs() as logs:
        assert (
            await cluster_reporter(write_kubeconfig(tmp_path / "k", "http://127.0.0.1:1"), None, {})
            is None
        )
    assert [e["event"] for e in logs] == ["cluster_reports_off"]


async def test_no_kubeconfig_outside_a_pod_is_one_line_and_no_reporter() -> None:
    with capture_logs() as logs:
        assert await cluster_reporter(None, "n1", {}) is None
    assert [e["event"] for e in logs] == ["cluster_reports_off"]
    assert "not in a pod" in logs[0]["reason"]


async def test_a_broken_kubeconfig_is_one_line_and_no_reporter(tmp_path: Path) -> None:
    broken = tmp_path / "k"
    broken.write_text("clusters: [")
    with capture_logs() as logs:
        assert await cluster_reporter(broken, "n1", {}) is None
    assert [e["event"] for e in logs] == ["cluster_reports_off"]
    assert str(broken) in logs[0]["reason"]
