"""daemonset/dra: the base's agent in DRA mode on the nodes labelled for it and nowhere
else, with the kubelet's DRA directories, DRA mode's rights (docs/dra.md) and the DeviceClasses
that claims name; and the example claim and pods that go with it."""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from agents.command_line import build_parser, parse_args
from agents.config import parse_config
from tests.deploy.manifests import (
    DAEMONSET_DIR,
    VARIANTS,
    Obj,
    agent_container,
    only,
    pod_spec,
    render,
)

DRA = "daemonset/dra"
BASE = "daemonset"
EXAMPLES = DAEMONSET_DIR / "dra" / "examples"
API_LABEL = "node-agents.io/api"
PLUGINS_DIR = "/var/lib/kubelet/plugins"
REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
CDI_ROOT = "/var/run/cdi"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
NFD_FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
# DRA mode writes its sockets, claim checkpoint and CDI specs; the device-plugin
# directory is only read (the kubelet's checkpoint), and the rest as in the base.
DRA_WRITABLE = {
    PLUGINS_DIR: "Directory",
    REGISTRY_DIR: "DirectoryOrCreate",
    CDI_ROOT: "DirectoryOrCreate",
    NFD_FEATURES_DIR: "DirectoryOrCreate",
    # The base's, for a node moved back from DRA mode: the drivers' own directories.
    f"{PLUGINS_DIR}/gpu.nvidia.com": "DirectoryOrCreate",
    f"{PLUGINS_DIR}/roce.node-agents.io": "DirectoryOrCreate",
}
# The rights of the reports to the cluster, and DRA mode's beside them.
DRA_RULES = [
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]},
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims"],
        "verbs": ["get", "list", "watch"],
    },
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceslices"],
        "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"],
    },
]
# The established gpu.nvidia.com classes' selectors, character for character.
DEVICE_CLASSES = {
    "gpu.nvidia.com": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
        "nvidia.com/gpu",
    ),
    "mig.nvidia.com": (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
        None,
    ),
    "roce.node-agents.io": ("device.driver == 'roce.node-agents.io'", None),
}
# Config keys DRA mode ignores, with a warning each (docs/dra.md).
IGNORED_IN_DRA = (
    ("sharing", "timeSlicing"),
    ("flags", "migStrategy"),
    ("flags", "deviceListStrategy"),
    ("flags", "deviceIDStrategy"),
    ("flags", "passDeviceSpecs"),
    ("roce", "resourceName"),
)


def without(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] != kind]


def host_mounts(objs: list[Obj]) -> dict[str, tuple[Obj, Obj]]:
    """host path -> (hostPath volume source, volumeMount) for every hostPath mounted."""
    volumes = {v["name"]: v["hostPath"] for v in pod_spec(objs)["volumes"] if "hostPath" in v}
    mounts = agent_container(objs)["volumeMounts"]
    return {
        volumes[m["name"]]["path"]: (volumes[m["name"]], m) for m in mounts if m["name"] in volumes
    }


def test_renders_the_agent_objects_renamed_and_the_three_device_classes() -> None:
    objs = render(DRA)
    base = render(BASE)
    assert sorted(o["kind"] for o in objs) == sorted(
        [o["kind"] for o in base] + ["DeviceClass"] * 3
    )
    assert {o["metadata"]["name"] for o in objs if o["kind"] == "DeviceClass"} == set(
        DEVICE_CLASSES
    )
    for obj in without(objs, "DeviceClass"):
        if obj["kind"] != "Namespace":
            assert (
                obj["metadata"]["name"].startswith("node-agent")
                and "-dra" in obj["metadata"]["name"]
            ), obj["metadata"]["name"]
        if obj["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "node-agents", obj["kind"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_applies_beside_each_device_plugin_variant_sharing_only_the_namespace(
    variant: str,
) -> None:
    names = [{(o["kind"], o["metadata"]["name"]) for o in render(v)} for v in (DRA, variant)]
    assert names[0] & names[1] == {("Namespace", "node-agents")}
    dra_set = only(render(DRA), "DaemonSet")
    other = only(render(variant), "DaemonSet")
    # This DaemonSet never claims the other's pods.
    own = dra_set["spec"]["selector"]["matchLabels"]
    assert not own.items() <= other["spec"]["template"]["metadata"]["labels"].items()


def test_the_agent_runs_with_api_dra_and_otherwise_the_base_command_line() -> None:
    args = agent_container(render(DRA))["args"]
    assert args == [*agent_container(render(BASE))["args"], "--api", "dra"]


def _run_options() -> set[str]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {opt for action in sub.choices["run"]._actions for opt in action.option_strings}


def test_the_agents_command_line_takes_dra_mode_with_the_mounted_directories() -> None:
    if "--api" not in _run_options():
        pytest.skip("this agent's command line has no --api yet (docs/dra.md)")
    opts = parse_args(agent_container(render(DRA))["args"])
    assert opts.command == "run"
    assert opts.api == "dra"
    # Where the agent looks by default must be where the pod mounts the host's dirs.
    mounted = {m["mountPath"] for m in agent_container(render(DRA))["volumeMounts"]}
    assert str(opts.device_plugin_dir) in mounted
    for attr, path in (
        ("kubelet_plugins_dir", PLUGINS_DIR),
        ("kubelet_registry_dir", REGISTRY_DIR),
        ("cdi_root", CDI_ROOT),
    ):
        if hasattr(opts, attr):
            assert str(getattr(opts, attr)) == path, attr


def test_dra_host_dirs_are_writable_at_their_host_paths_and_every_other_read_only() -> None:
    mounts = host_mounts(render(DRA))
    for host, kind in DRA_WRITABLE.items():
        source, mount = mounts[host]
        # The kubelet dials the socket paths the agent registers: inside as outside.
        assert mount["mountPath"] == host
        assert not mount.get("readOnly", False), host
        assert source["type"] == kind, host
    for host, (_, mount) in mounts.items():
        if host not in DRA_WRITABLE:
            assert mount.get("readOnly") is True, f"{host} is mounted writable"


def test_the_device_plugin_checkpoint_stays_readable_where_the_agent_looks() -> None:
    _, mount = host_mounts(render(DRA))[DEVICE_PLUGIN_DIR]
    assert mount == {"name": mount["name"], "mountPath": DEVICE_PLUGIN_DIR, "readOnly": True}
    # The base, by contrast, serves its plugin sockets there.
    _, base_mount = host_mounts(render(BASE))[DEVICE_PLUGIN_DIR]
    assert not base_mount.get("readOnly", False)


def test_security_settings_are_the_bases() -> None:
    dra, base = render(DRA), render(BASE)
    ctx = agent_container(dra)["securityContext"]
    assert ctx == agent_container(base)["securityContext"]
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["NET_RAW"]}
    assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False
    for field in ("securityContext", "hostPID", "hostIPC", "hostNetwork"):
        assert pod_spec(dra).get(field) == pod_spec(base).get(field), field


def test_the_account_may_do_exactly_what_spec_section_10_lists() -> None:
    objs = render(DRA)
    role, binding = only(objs, "ClusterRole"), only(objs, "ClusterRoleBinding")
    assert role["rules"] == DRA_RULES
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    account = only(objs, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    assert pod_spec(objs)["serviceAccountName"] == account["name"]
    assert pod_spec(objs)["automountServiceAccountToken"] is True


@pytest.mark.parametrize("name", sorted(DEVICE_CLASSES))
def test_device_class_selects_its_driver_with_the_established_expression(name: str) -> None:
    (cls,) = [
        o for o in render(DRA) if o["kind"] == "DeviceClass" and o["metadata"]["name"] == name
    ]
    expression, extended = DEVICE_CLASSES[name]
    assert cls["apiVersion"] == "resource.k8s.io/v1"
    assert cls["spec"]["selectors"] == [{"cel": {"expression": expression}}]
    assert cls["spec"].get("extendedResourceName") == extended
    assert set(cls["spec"]) <= {"selectors", "extendedResourceName"}


def test_shipped_dra_config_is_accepted_and_sets_no_key_this_mode_ignores() -> None:
    text = only(render(DRA), "ConfigMap")["data"]["default"]
    config = yaml.safe_load(text)
    for section, key in IGNORED_IN_DRA:
        assert key not in config.get(section, {}), f"{section}.{key}"
    # Every value it sets is the default, as in the base's file.
    assert parse_config(text, "daemonset/dra/agent/config.yaml") == parse_config("", "(empty)")


def test_differs_from_the_base_only_in_what_agent_kustomization_lists() -> None:
    dra, base = render(DRA), render(BASE)
    assert only(dra, "Namespace") == only(base, "Namespace")
    dra_volumes = [v for v in pod_spec(dra)["volumes"] if "configMap" not in v]
    base_volumes = [v for v in pod_spec(base)["volumes"] if "configMap" not in v]
    assert dra_volumes[: len(base_volumes)] == base_volumes
    added = {v["name"]: v["hostPath"]["path"] for v in dra_volumes[len(base_volumes) :]}
    assert added == {"kubelet-plugins": PLUGINS_DIR}
    mounts = agent_container(dra)["volumeMounts"]
    base_mounts = agent_container(base)["volumeMounts"]
    assert [m for m in mounts if m["mountPath"] != DEVICE_PLUGIN_DIR][: len(base_mounts) - 1] == [
        m for m in base_mounts if m["mountPath"] != DEVICE_PLUGIN_DIR
    ]
    assert [m["name"] for m in mounts[len(base_mounts) :]] == list(added)
    container, expected = agent_container(dra), agent_container(base)
    for c in (container, expected):
        del c["args"], c["volumeMounts"]
    assert container == expected
    spec, wanted = pod_spec(dra), pod_spec(base)
    for s in (spec, wanted):
        del s["containers"], s["volumes"], s["affinity"], s["serviceAccountName"]
    assert spec == wanted


# Node affinity, evaluated as the scheduler and the DaemonSet controller do: terms are
# ORed, a term's expressions ANDed.
def _holds(expression: Obj, labels: Mapping[str, str]) -> bool:
    key, op, values = expression["key"], expression["operator"], expression.get("values", [])
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {op} not evaluated here")


def runs_on(objs: list[Obj], labels: Mapping[str, str]) -> bool:
    spec = pod_spec(objs)
    if not all(labels.get(k) == v for k, v in spec.get("nodeSelector", {}).items()):
        return False
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return any(
        all(_holds(e, labels) for e in term["matchExpressions"])
        for term in required["nodeSelectorTerms"]
    )


NODE_LABELS = (
    "feature.node.kubernetes.io/pci-10de.present",
    "nvidia.com/gpu.present",
    "node-agents.io/gpu-node",
    "feature.node.kubernetes.io/rdma.capable",
    "node-agents.io/rdma-node",
)


def _nodes() -> list[dict[str, str]]:
    """Every node: each subset of the device labels, with no API label, dra or another."""
    found = []
    for n in range(len(NODE_LABELS) + 1):
        for chosen in itertools.combinations(NODE_LABELS, n):
            for api in (None, "dra", "device-plugin"):
                labels = {label: "true" for label in chosen}
                if api is not None:
                    labels[API_LABEL] = api
                found.append(labels)
    return found


def test_the_dra_agent_and_a_device_plugin_agent_never_run_on_one_node() -> None:
    dra = render(DRA)
    others = {v: render(v) for v in VARIANTS}
    for labels in _nodes():
        on = [v for v, objs in others.items() if runs_on(objs, labels)]
        if runs_on(dra, labels):
            assert on == [], (labels, on)


def test_the_api_label_alone_moves_a_gpu_node_between_the_two_agents() -> None:
    dra, base = render(DRA), render(BASE)
    for labels in _nodes():
        gpu_node = any(labels.get(k) == "true" for k in NODE_LABELS[:3])
        wants_dra = labels.get(API_LABEL) == "dra"
        assert runs_on(dra, labels) is (gpu_node and wants_dra), labels
        assert runs_on(base, labels) is (gpu_node and not wants_dra), labels


def _example(name: str) -> Obj:
    doc: Obj = yaml.safe_load((EXAMPLES / name).read_text())
    return doc


def test_example_claim_pairs_each_of_two_gpus_with_a_nic_on_its_pcie_switch() -> None:
    template = _example("claim-template-2gpu-2nic.yaml")
    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert template["kind"] == "ResourceClaimTemplate"
    devices = template["spec"]["spec"]["devices"]
    classes = {r["name"]: r["exactly"]["deviceClassName"] for r in devices["requests"]}
    assert sorted(classes.values()) == sorted(["gpu.nvidia.com"] * 2 + ["roce.node-agents.io"] * 2)
    assert set(classes.values()) <= set(DEVICE_CLASSES)
    for request in devices["requests"]:
        # One device a request: a constraint then pairs exactly one GPU with one NIC.
        assert request["exactly"].get("count", 1) == 1
        assert request["exactly"].get("allocationMode", "ExactCount") == "ExactCount"
    pairs = [c["requests"] for c in devices["constraints"]]
    assert all(c["matchAttribute"] == "node-agents.io/pcieSwitch" for c in devices["constraints"])
    assert sorted(classes[r] for pair in pairs for r in pair) == sorted(classes.values())
    for pair in pairs:
        assert sorted(classes[r] for r in pair) == ["gpu.nvidia.com", "roce.node-agents.io"]


def test_example_pod_gives_its_container_the_claim_from_the_template() -> None:
    pod = _example("pod-2gpu-2nic.yaml")
    template = _example("claim-template-2gpu-2nic.yaml")
    (claim,) = pod["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["claims"] == [{"name": claim["name"]}]


def test_example_extended_resource_pod_asks_for_the_gpu_class_extended_name() -> None:
    pod = _example("pod-extended-resource.yaml")
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"] == {DEVICE_CLASSES["gpu.nvidia.com"][1]: 1}
    assert "resourceClaims" not in pod["spec"]


def test_the_share_example_asks_a_gpu_for_consumable_memory_and_compute() -> None:
    template = _example("claim-template-gpu-share.yaml")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert request["exactly"]["capacity"]["requests"] == {"memory": "20Gi", "compute": "25"}


def test_examples_are_not_part_of_the_overlay() -> None:
    kinds = {o["kind"] for o in render(DRA)}
    assert not kinds & {"Pod", "ResourceClaimTemplate"}
    assert sorted(p.name for p in Path(EXAMPLES).iterdir()) == [
        "claim-template-2gpu-2nic.yaml",
        "claim-template-gpu-share.yaml",
        "pod-2gpu-2nic.yaml",
        "pod-extended-resource.yaml",
    ]
