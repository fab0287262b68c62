"""daemonset/overlays/per-node-config: the base with a ConfigMap of named configs mounted
whole at /etc/node-agents/configs, --config-dir instead of --config, and the right to
read and watch Nodes; nothing else differs."""

from __future__ import annotations

import pytest

from agents.command_line import parse_args
from agents.config import parse_config
from agents.core.config_choice import DEFAULT_LABEL
from tests.deploy.manifests import Obj, agent_container, only, pod_spec, render
from tests.deploy.test_manifests import API_RULES

OVERLAY = "daemonset/overlays/per-node-config"
BASE = "daemonset"
CONFIG_DIR = "/etc/node-agents/configs"  # where the Helm chart mounts it too
NODE_RULE = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch"]}


def _config_volume(objs: list[Obj]) -> Obj:
    found: Obj
    (found,) = [v for v in pod_spec(objs)["volumes"] if v["name"] == "config"]
    return found


def test_the_agent_reads_named_configs_from_the_mounted_configmap_by_nvidias_label() -> None:
    objs = render(OVERLAY)
    container = agent_container(objs)
    opts = parse_args(container["args"])
    assert (str(opts.config_dir), opts.config_default, opts.config) == (
        CONFIG_DIR,
        "default",
        None,
    )
    assert opts.config_label == DEFAULT_LABEL == "nvidia.com/device-plugin.config"
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    # Whole, never by subPath: the kubelet does not update a subPath mount.
    assert mount == {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}
    configmap = only(objs, "ConfigMap")
    assert _config_volume(objs)["configMap"] == {"name": configmap["metadata"]["name"]}


def test_the_configmap_keeps_its_name_so_an_edit_is_applied_in_place_not_rolled_out() -> None:
    configmap = only(render(OVERLAY), "ConfigMap")
    assert configmap["metadata"]["name"] == "node-agent-configs"  # no hash suffix


def test_each_named_config_is_accepted_and_default_is_the_bases_config() -> None:
    data = only(render(OVERLAY), "ConfigMap")["data"]
    assert sorted(data) == ["default", "ts4"]
    configs = {name: parse_config(text, name) for name, text in data.items()}
    base = only(render(BASE), "ConfigMap")["data"]["default"]
    assert configs["default"] == parse_config(base, "base")
    [shared] = configs["ts4"].sharing.time_slicing.resources
    assert (shared.name, shared.replicas) == ("nvidia.com/gpu", 4)


def test_the_account_may_also_get_and_watch_nodes_and_nothing_more() -> None:
    assert only(render(OVERLAY), "ClusterRole")["rules"] == [*API_RULES, NODE_RULE]


def test_per_node_config_differs_from_the_base_in_nothing_else() -> None:
    overlay, base = render(OVERLAY), render(BASE)
    assert sorted(o["kind"] for o in overlay) == sorted(o["kind"] for o in base)
    for kind in ("Namespace", "ServiceAccount", "ClusterRoleBinding"):
        assert only(overlay, kind) == only(base, kind), kind
    role = only(overlay, "ClusterRole")
    role["rules"].remove(NODE_RULE)
    assert role == only(base, "ClusterRole")
    container, wanted = agent_container(overlay), agent_container(base)
    args = container["args"]
    assert args[1:5] == ["--config-dir", CONFIG_DIR, "--config-default", "default"]
    assert wanted["args"][1:3] == ["--config", "/etc/node-agents/configs/default"]
    container["args"] = [args[0], *wanted["args"][1:3], *args[5:]]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    mount["mountPath"] = "/etc/node-agents/configs"
    _config_volume(overlay)["configMap"] = _config_volume(base)["configMap"]
    daemonset = only(overlay, "DaemonSet")
    daemonset["spec"]["template"]["spec"]["containers"] = [container]
    assert daemonset == only(base, "DaemonSet")


@pytest.mark.parametrize("version", ["1.26.0", "1.31.0"])
def test_per_node_config_objects_match_the_strict_kubernetes_schema(version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for obj in render(OVERLAY):
        kubernetes_validate.validate(obj, version, strict=True)
