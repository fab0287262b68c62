"""What the DaemonSet promises an operator: where it runs, what it may touch on the
host, how it is probed and updated, and the configuration it ships with."""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

import pytest
import yaml

from agents.command_line import parse_args
from agents.config import parse_config
from agents.metrics import METRICS_PORT
from tests.deploy.manifests import (
    DAEMONSET_DIR,
    VARIANTS,
    Obj,
    agent_container,
    flag,
    only,
    pod_spec,
    render,
    required_flag,
)

NAMESPACE = "node-agents"
IMAGE = "ghcr.io/node-agents/node-agent:0.1.0"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
NFD_FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
# The host paths the agent writes to; every other hostPath must be mounted read-only.
# The DRA drivers' own plugin directories, the CDI specs and the plugin registry: a node
# moved from DRA mode serves the drivers for the kubelet to unprepare the claims prepared
# there as their pods end (docs/dra.md).
DRA_DIRS = frozenset(
    {
        "/var/lib/kubelet/plugins/gpu.nvidia.com",
        "/var/lib/kubelet/plugins/roce.node-agents.io",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
    }
)
WRITABLE_HOST_PATHS = frozenset({DEVICE_PLUGIN_DIR, NFD_FEATURES_DIR}) | DRA_DIRS
# Capabilities added back after dropping ALL, by whether the agent runs RoCE: NET_RAW to
# hear the switches' LLDP frames (docs/fabric.md), nothing else;
# daemonset/base/daemonset.yaml says why none of the usual candidates is needed.
# Adding one must change this line too.
JUSTIFIED_CAPABILITIES: dict[bool, frozenset[str]] = {
    True: frozenset({"NET_RAW"}),
    False: frozenset(),
}
# The one family that needs the host's network namespace (netlink link events).
HOST_NETWORK_FAMILY = "roce"

variants = pytest.mark.parametrize("variant", VARIANTS)
CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding"})
# All the agent may do with the API server (docs/architecture.md, reports to the cluster).
API_RULES = [
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]},  # --label-node
]


def host_path_mounts(objs: list[Obj]) -> list[tuple[str, Obj]]:
    """(host path, volumeMount) for every hostPath volume the agent mounts."""
    host_paths = {
        v["name"]: v["hostPath"]["path"] for v in pod_spec(objs)["volumes"] if "hostPath" in v
    }
    mounts = agent_container(objs)["volumeMounts"]
    return [(host_paths[m["name"]], m) for m in mounts if m["name"] in host_paths]


def env(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env", [])}


@variants
def test_renders_namespace_serviceaccount_configmap_and_daemonset_in_one_namespace(
    variant: str,
) -> None:
    objs = render(variant)
    assert sorted(o["kind"] for o in objs) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "Namespace",
        "ServiceAccount",
    ]
    assert only(objs, "Namespace")["metadata"]["name"] == NAMESPACE
    for obj in objs:
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["kind"]


@variants
def test_container_runs_unprivileged_with_only_net_raw_for_roce_and_read_only_root(
    variant: str,
) -> None:
    objs = render(variant)
    ctx = agent_container(objs)["securityContext"]
    assert ctx["privileged"] is False
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"]["drop"] == ["ALL"]
    roce = HOST_NETWORK_FAMILY in families(objs)
    assert frozenset(ctx["capabilities"].get("add", [])) == JUSTIFIED_CAPABILITIES[roce]
    # Patching Node labels comes with the fabric's labels, and so with RoCE.
    assert ("--label-node" in agent_container(objs)["args"]) is roce


@variants
def test_seccomp_profile_is_runtime_default(variant: str) -> None:
    objs = render(variant)
    container_ctx = agent_container(objs)["securityContext"]
    pod_ctx = pod_spec(objs).get("securityContext", {})
    # The container's setting wins over the pod's; either must be RuntimeDefault and
    # neither may weaken it.
    profiles = [c["seccompProfile"]["type"] for c in (container_ctx, pod_ctx) if c]
    assert profiles, "no seccompProfile set"
    assert set(profiles) == {"RuntimeDefault"}


def families(objs: list[Obj]) -> set[str]:
    """The families the agent runs: --families, or every one when it is absent."""
    return set((flag(agent_container(objs)["args"], "--families") or "gpu,roce").split(","))


@variants
def test_pod_shares_no_host_pid_or_ipc_namespace_and_no_host_port(variant: str) -> None:
    objs = render(variant)
    spec = pod_spec(objs)
    for field in ("hostPID", "hostIPC"):
        assert not spec.get(field, False), field
    assert "hostPort" not in str(agent_container(objs).get("ports"))


@variants
def test_host_network_only_where_the_roce_family_needs_netlink(variant: str) -> None:
    objs = render(variant)
    spec = pod_spec(objs)
    # netlink link events of the host's NICs reach only the host's network namespace;
    # daemonset/base/daemonset.yaml says so next to hostNetwork. Nothing else may use it.
    needs_host_network = HOST_NETWORK_FAMILY in families(objs)
    assert spec.get("hostNetwork", False) is needs_host_network
    expected_dns = "ClusterFirstWithHostNet" if needs_host_network else "ClusterFirst"
    assert spec.get("dnsPolicy", "ClusterFirst") == expected_dns


def test_host_network_is_on_in_base_and_roce_only_and_off_in_gpu_only() -> None:
    on = {v: pod_spec(render(v)).get("hostNetwork", False) for v in VARIANTS}
    assert on == {
        "daemonset": True,
        "daemonset/overlays/gpu-only": False,
        "daemonset/overlays/roce-only": True,
    }


def test_host_network_carries_its_justification() -> None:
    text = (DAEMONSET_DIR / "base" / "daemonset.yaml").read_text()
    before, _, _ = text.partition("hostNetwork: true")
    comment = " ".join(
        line.strip().lstrip("# ") for line in before.splitlines()[-8:] if line.strip()
    )
    assert "netlink" in comment and "gpu-only" in comment, comment


@variants
def test_host_paths_are_read_only_except_device_plugin_and_nfd_dirs(variant: str) -> None:
    mounts = host_path_mounts(render(variant))
    assert {host for host, _ in mounts} >= WRITABLE_HOST_PATHS
    for host, mount in mounts:
        if host in WRITABLE_HOST_PATHS:
            # Writable dirs are mounted where the agent's defaults expect them.
            assert mount["mountPath"] == host
            assert not mount.get("readOnly", False), host
        else:
            assert mount.get("readOnly") is True, f"{host} is mounted writable"


@variants
def test_only_scratch_space_is_writable_besides_host_dirs(variant: str) -> None:
    objs = render(variant)
    volumes = {v["name"]: v for v in pod_spec(objs)["volumes"]}
    for mount in agent_container(objs)["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            assert mount.get("readOnly") is True
        if "emptyDir" in volume:
            assert mount["mountPath"] == "/tmp"
            assert volume["emptyDir"].get("sizeLimit"), "scratch space must be bounded"


@variants
def test_service_account_token_is_mounted_for_the_api_server_reports(variant: str) -> None:
    objs = render(variant)
    assert only(objs, "ServiceAccount")["automountServiceAccountToken"] is True
    spec = pod_spec(objs)
    assert spec["automountServiceAccountToken"] is True
    assert spec["serviceAccountName"] == only(objs, "ServiceAccount")["metadata"]["name"]


@variants
def test_the_account_may_only_create_and_patch_events_and_patch_node_status(
    variant: str,
) -> None:
    objs = render(variant)
    role, binding = only(objs, "ClusterRole"), only(objs, "ClusterRoleBinding")
    # --label-node comes with the RoCE family (LLDP), and its right with it.
    labels_node = "--label-node" in agent_container(objs)["args"]
    assert labels_node == (variant != "daemonset/overlays/gpu-only")
    assert role["rules"] == (API_RULES if labels_node else API_RULES[:2])
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = only(objs, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]


@variants
def test_the_node_name_comes_from_the_pod_spec(variant: str) -> None:
    node_name = env(agent_container(render(variant)))["NODE_NAME"]
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


@variants
def test_resources_request_cpu_and_memory_and_limit_memory(variant: str) -> None:
    resources = agent_container(render(variant))["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    assert "memory" in resources["limits"]


@variants
def test_scheduling_is_node_critical_on_tainted_gpu_nodes(variant: str) -> None:
    objs = render(variant)
    spec = pod_spec(objs)
    assert spec["priorityClassName"] == "system-node-critical"
    tolerations = {(t["key"], t.get("effect")) for t in spec["tolerations"]}
    assert ("nvidia.com/gpu", "NoSchedule") in tolerations
    assert ("CriticalAddonsOnly", None) in tolerations
    assert all(t["operator"] == "Exists" for t in spec["tolerations"])
    strategy = only(objs, "DaemonSet")["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    assert spec["terminationGracePeriodSeconds"] == 30


@variants
def test_liveness_probe_hits_healthz_on_the_metrics_port(variant: str) -> None:
    container = agent_container(render(variant))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    assert probe["port"] == "metrics"
    host, port = required_flag(container["args"], "--metrics-address").rsplit(":", 1)
    assert int(port) == ports["metrics"]
    # Bound where the kubelet's probe arrives, the pod IP (the node's IP under
    # hostNetwork), and nowhere else on the node.
    assert host == "$(POD_IP)"
    pod_ip = env(container)["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert pod_ip == "status.podIP"


# Default ports of what else runs on GPU nodes, often on the host network too; the
# table in docs/configuration.md#metrics-port says whose.
TAKEN_PORTS = {
    *(5555, 8000, 8080, 8081, 8181, 9090, 9091, 9093, 9099, 9100, 9153, 9253, 9400, 9808),
    *(4240, 4244, 5473, 9879, 9890, *range(9962, 9966), 10254),
    *(10248, 10249, 10250, 10255, 10256),
}


@variants
def test_metrics_port_is_the_documented_one_and_no_common_gpu_node_default(variant: str) -> None:
    container = agent_container(render(variant))
    port = int(required_flag(container["args"], "--metrics-address").rsplit(":", 1)[1])
    assert port == METRICS_PORT == 17400
    assert port not in TAKEN_PORTS
    assert not 9100 <= port <= 9999  # the Prometheus exporters' range, all allocated
    assert port < 30000  # below the NodePort range and the kernel's ephemeral ports
    reference = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    section = reference[reference.index("### Metrics port") :]
    table = section[: section.index("\n## ")]
    listed = {
        port
        for low, high in re.findall(r"\b(\d{4,5})(?:-(\d{4,5}))?\b", table)
        for port in range(int(low), int(high or low) + 1)
    }
    assert TAKEN_PORTS - listed == set()
    assert f"port {METRICS_PORT}" in section


@variants
def test_agent_is_started_with_config_json_logs_and_nfd_file(variant: str) -> None:
    objs = render(variant)
    container = agent_container(objs)
    args = container["args"]
    assert container["image"] == IMAGE
    assert args[0] == "run"
    assert flag(args, "--log-format") == "json"
    config = PurePosixPath(required_flag(args, "--config"))
    config_mounts = [m for m in container["volumeMounts"] if m["name"] == _config_volume_name(objs)]
    assert [m["mountPath"] for m in config_mounts] == [str(config.parent)]
    assert config.name in only(objs, "ConfigMap")["data"]
    nfd_file = PurePosixPath(required_flag(args, "--nfd-features-file"))
    assert str(nfd_file.parent) == NFD_FEATURES_DIR
    node_name = env(container)["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert node_name == "spec.nodeName"


def _config_volume_name(objs: list[Obj]) -> str:
    configmap = only(objs, "ConfigMap")["metadata"]["name"]
    volumes = pod_spec(objs)["volumes"]
    names = [v["name"] for v in volumes if v.get("configMap", {}).get("name") == configmap]
    assert len(names) == 1, "the DaemonSet must mount the rendered ConfigMap"
    return str(names[0])


GPU_NODE_LABELS = (
    "feature.node.kubernetes.io/pci-10de.present",  # node-feature-discovery: an NVIDIA device
    "nvidia.com/gpu.present",  # NVIDIA's GPU feature discovery
    "node-agents.io/gpu-node",  # ours, set by the operator where neither runs
)
RDMA_NODE_LABELS = (
    "feature.node.kubernetes.io/rdma.capable",  # node-feature-discovery's built-in rule
    "feature.node.kubernetes.io/pci-15b3.present",  # NFD: a Mellanox/NVIDIA NIC
    "node-agents.io/rdma-node",  # ours
)
OVERLAYS = ("daemonset/overlays/gpu-only", "daemonset/overlays/roce-only")


def node_terms(objs: list[Obj]) -> list[list[tuple[str, str, tuple[str, ...]]]]:
    """The DaemonSet's required node affinity: a list of ORed terms of ANDed expressions."""
    spec = pod_spec(objs)
    assert "nodeSelector" not in spec, "a nodeSelector would AND with the affinity's terms"
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [
        [(e["key"], e["operator"], tuple(e.get("values", ()))) for e in term["matchExpressions"]]
        for term in required["nodeSelectorTerms"]
    ]


# Every device-plugin variant keeps off the nodes daemonset/dra serves: a node serves its
# devices through one API only (tests/deploy/test_dra_overlay.py checks both sides).
NOT_DRA = ("node-agents.io/api", "NotIn", ("dra",))


def any_of(*labels: str) -> list[list[tuple[str, str, tuple[str, ...]]]]:
    return [[(label, "In", ("true",)), NOT_DRA] for label in labels]


def test_base_runs_every_family_on_nodes_labelled_as_gpu_nodes_by_nfd_gfd_or_us() -> None:
    objs = render("daemonset")
    container = agent_container(objs)
    assert flag(container["args"], "--families") is None
    assert node_terms(objs) == any_of(*GPU_NODE_LABELS)
    assert env(container)["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"


def test_gpu_only_overlay_runs_the_gpu_family_on_gpu_nodes() -> None:
    objs = render("daemonset/overlays/gpu-only")
    container = agent_container(objs)
    assert flag(container["args"], "--families") == "gpu"
    assert node_terms(objs) == any_of(*GPU_NODE_LABELS)
    assert env(container)["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"


def test_roce_only_overlay_runs_the_roce_family_on_rdma_nodes_without_gpu_access() -> None:
    objs = render("daemonset/overlays/roce-only")
    container = agent_container(objs)
    assert flag(container["args"], "--families") == "roce"
    assert node_terms(objs) == any_of(*RDMA_NODE_LABELS)
    assert not any(name.startswith("NVIDIA_") for name in env(container))
    assert "NODE_NAME" in env(container)


def test_overlays_only_add_the_families_flag_and_a_feature_file_of_their_own() -> None:
    base = agent_container(render("daemonset"))["args"]
    nfd = flag(base, "--nfd-features-file")
    for overlay, family in (("gpu-only", "gpu"), ("roce-only", "roce")):
        args = agent_container(render(f"daemonset/overlays/{overlay}"))["args"]
        own = [f"{a}-{family}" if a == nfd else a for a in base]
        if family == "gpu":  # no fabric labels without RoCE: not patched, never unset
            own.remove("--label-node")
        assert args == [*own, "--families", family]


def test_gpu_only_and_roce_only_can_run_side_by_side() -> None:
    gpu, roce = (render(v) for v in OVERLAYS)
    names = [{(o["kind"], o["metadata"]["name"]) for o in objs} for objs in (gpu, roce)]
    # The Namespace is the same object in both; nothing else is shared.
    assert names[0] & names[1] == {("Namespace", NAMESPACE)}
    selectors = [only(objs, "DaemonSet")["spec"]["selector"]["matchLabels"] for objs in (gpu, roce)]
    for selector, other in ((gpu, roce), (roce, gpu)):
        pod_labels = only(other, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
        own = only(selector, "DaemonSet")["spec"]["selector"]["matchLabels"]
        assert not own.items() <= pod_labels.items(), "a DaemonSet would select the other's pods"
    assert selectors[0] != selectors[1]
    # Two agents on one node: their own feature files, and never the same host port.
    files = {flag(agent_container(objs)["args"], "--nfd-features-file") for objs in (gpu, roce)}
    assert len(files) == 2
    assert [pod_spec(objs).get("hostNetwork", False) for objs in (gpu, roce)].count(True) <= 1


POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"


@variants
def test_pod_resources_are_mounted_read_only_where_the_agent_is_told_to_look(
    variant: str,
) -> None:
    objs = render(variant)
    mounts = {host: m for host, m in host_path_mounts(objs)}
    assert mounts[POD_RESOURCES_DIR]["mountPath"] == POD_RESOURCES_DIR
    assert mounts[POD_RESOURCES_DIR]["readOnly"] is True
    socket = flag(agent_container(objs)["args"], "--pod-resources-socket")
    assert socket == f"{POD_RESOURCES_DIR}/kubelet.sock"


@variants
def test_shipped_config_is_the_spec_shape_with_defaults(variant: str) -> None:
    text = only(render(variant), "ConfigMap")["data"]["default"]
    config = yaml.safe_load(text)
    assert config["version"] == "v1"
    assert config["flags"]["migStrategy"] == "none"
    assert config["sharing"]["timeSlicing"]["resources"] == []
    assert config["roce"]["resourceName"] == "rdma/roce"
    assert set(config) == {"version", "flags", "sharing", "roce", "pairing", "health"}


def test_shipped_config_is_accepted_by_the_agent() -> None:
    text = only(render("daemonset"), "ConfigMap")["data"]["default"]
    config = parse_config(text, "daemonset/base/config.yaml")
    # config.yaml says every value in it is the default; an empty file gives those.
    assert config == parse_config("", "(empty)")


@variants
def test_container_args_are_accepted_by_the_agents_command_line(variant: str) -> None:
    args = agent_container(render(variant))["args"]
    # The image's ENTRYPOINT is node-agent, so args are its whole command line; a flag
    # the agent does not know would exit 2 here as it would crash-loop on every node.
    opts = parse_args(args)
    assert opts.command == "run"
