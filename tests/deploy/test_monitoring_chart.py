"""The chart's monitoring, rendered by real Helm: the metrics Service, the ServiceMonitor,
the PrometheusRule and the Grafana dashboard, each only when turned on; the rules pass
Debian's promtool (`check rules`, and `test rules` with tests/deploy/prometheus/), as
rendered."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.manifests import Obj, only
from tests.deploy.test_helm_chart import CHART, refused, template

ALL_ON = (
    *("--set", "metrics.serviceMonitor.enabled=true"),
    *("--set", "metrics.prometheusRule.enabled=true"),
    *("--set", "metrics.dashboard.enabled=true"),
)
RULES_TEST = Path(__file__).parent / "prometheus" / "rules-test.yaml"
KINDS = {"Service", "ServiceMonitor", "PrometheusRule"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        why = "promtool is not installed: hack/prereqs installs Debian's prometheus"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return found


def dashboards(objs: list[Obj]) -> list[Obj]:
    return [
        o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")
    ]


def test_nothing_of_monitoring_is_rendered_unless_turned_on() -> None:
    objs = template()
    assert not {o["kind"] for o in objs} & KINDS
    assert dashboards(objs) == []


def test_the_service_selects_the_agents_pods_on_their_metrics_port_headless() -> None:
    objs = template("--set", "metrics.service.enabled=true", "--set", "metrics.port=9500")
    service = only(objs, "Service")
    pod_labels = only(objs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == pod_labels
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9500, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert "ServiceMonitor" not in {o["kind"] for o in objs}


@pytest.mark.parametrize("families", ["{gpu,roce}", "{gpu}", "{roce}"])
def test_the_service_monitor_scrapes_its_own_service_honouring_the_agents_labels(
    families: str,
) -> None:
    objs = template(
        *ALL_ON,
        "--set",
        f"families={families}",
        "--set",
        "metrics.serviceMonitor.labels.release=prom",
    )
    monitor = only(objs, "ServiceMonitor")
    service = only(objs, "Service")  # the monitor brings the Service along
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["metadata"]["labels"]["release"] == "prom"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["honorLabels"] is True
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in (
        endpoint["relabelings"]
    )
    # The job is the Service's name, which the rules' NodeAgentDown matches.
    assert service["metadata"]["name"].startswith("node-agent")


def test_the_prometheus_rule_is_the_rules_file_as_it_is() -> None:
    rule = only(template(*ALL_ON), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts == {
        "NodeAgentDown",
        "NodeAgentDeviceUnhealthy",
        "NodeAgentDeviceDegraded",
        "NodeAgentGpuXids",
        "NodeAgentRoceLinkDown",
        "NodeAgentFabricLabelGone",
        "NodeAgentGpuShareOverMemory",
    }


def test_the_dashboard_is_a_configmap_the_grafana_sidecar_picks_up() -> None:
    (dashboard,) = dashboards(template(*ALL_ON, "--set", "metrics.dashboard.namespace=monitoring"))
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == "monitoring"
    shipped = json.loads((CHART / "files" / "dashboard.json").read_text())
    assert json.loads(dashboard["data"]["node-agents.json"]) == shipped
    titles = {p["title"] for p in shipped["panels"] if p["type"] == "row"}
    assert titles >= {"Per node", "Per GPU", "Per pod"}


@pytest.mark.parametrize(
    ("setting", "why"),
    [
        ("metrics.serviceMonitor.interval=soon", "interval"),
        ("metrics.dashboard.enabled=yes", "enabled"),
        ("metrics.prometheusRule.severity=high", "severity"),
    ],
)
def test_the_schema_refuses_bad_monitoring_values(setting: str, why: str) -> None:
    args = ("--set-string", setting) if "enabled" in setting else ("--set", setting)
    assert why in refused(*args)


def _rendered_rules(tmp_path: Path) -> Path:
    spec = only(template(*ALL_ON), "PrometheusRule")["spec"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_promtool_accepts_the_rendered_rules(tmp_path: Path) -> None:
    out = subprocess.run(
        [promtool(), "check", "rules", str(_rendered_rules(tmp_path))],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 7 rules found" in out.stdout


def test_each_alert_fires_and_stays_silent_as_promtool_unit_tests_say(tmp_path: Path) -> None:
    _rendered_rules(tmp_path)
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    out = subprocess.run(
        [promtool(), "test", "rules", str(tmp_path / RULES_TEST.name)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    tested = yaml.safe_load(RULES_TEST.read_text())["tests"]
    fired = {a["alertname"] for t in tested for a in t["alert_rule_test"] if a.get("exp_alerts")}
    silent = {
        a["alertname"] for t in tested for a in t["alert_rule_test"] if not a.get("exp_alerts")
    }
    assert (
        fired
        == silent
        == {
            "NodeAgentDown",
            "NodeAgentDeviceUnhealthy",
            "NodeAgentDeviceDegraded",
            "NodeAgentGpuXids",
            "NodeAgentRoceLinkDown",
            "NodeAgentFabricLabelGone",
            "NodeAgentGpuShareOverMemory",
        }
    )
