"""The Helm chart (daemonset/chart/node-agents), linted and rendered by real Helm through
hack/helm: each variant's objects equal kustomize's, and its values act as documented."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest
import yaml

from agents.config import parse_config
from tests.deploy.manifests import REPO, Obj, agent_container, flag, only, pod_spec, render

CHART = REPO / "daemonset" / "chart" / "node-agents"
HELM_PYTHON = REPO / ".helm-venv" / "bin" / "python"
# kustomize variant -> the chart's values file for it (None: the chart's defaults).
VARIANTS = {
    "daemonset": None,
    "daemonset/overlays/gpu-only": "ci/gpu-only-values.yaml",
    "daemonset/overlays/roce-only": "ci/roce-only-values.yaml",
    "daemonset/dra": "ci/dra-values.yaml",
    "daemonset/lab": "ci/lab-values.yaml",
    "daemonset/overlays/mps": "ci/mps-values.yaml",
    "daemonset/overlays/dra-mps": "ci/dra-mps-values.yaml",
}
V1 = "version: v1"  # the smallest config file
MANAGED_BY = "app.kubernetes.io/managed-by"
INSTANCE = "app.kubernetes.io/instance"


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    if not HELM_PYTHON.exists():
        why = "real Helm is not installed: run hack/helm setup (makes .helm-venv)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    command = [str(HELM_PYTHON), str(REPO / "hack" / "helm"), *args]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)


@functools.cache
def _template(args: tuple[str, ...]) -> tuple[Obj, ...]:
    out = _helm("template", *args)
    assert out.returncode == 0, f"hack/helm template {args} failed:\n{out.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def template(*args: str) -> list[Obj]:
    """The objects `helm install` would make with these -f/--set arguments."""
    return [dict(o) for o in yaml.safe_load(yaml.safe_dump(list(_template(args))))]


def refused(*args: str) -> str:
    """hack/helm template's error for values the chart must refuse."""
    out = _helm("template", *args)
    assert out.returncode == 1, f"rendered, expected a refusal: {out.stdout[:200]}"
    assert out.stdout == ""
    return out.stderr


def _values_args(values_file: str | None) -> tuple[str, ...]:
    return ("-f", str(CHART / values_file)) if values_file else ()


def _as_kustomize_would(obj: Obj) -> Obj:
    """The documented differences, undone: Helm's managed-by label, and the Namespace (only
    with createNamespace) without the overlays' instance label."""
    labels = obj["metadata"]["labels"]
    assert labels[MANAGED_BY] == "Helm"
    labels[MANAGED_BY] = "kustomize"
    return obj


def _by_name(objs: list[Obj]) -> dict[tuple[str, str], Obj]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


@pytest.mark.parametrize("values_file", sorted(v or "values.yaml" for v in VARIANTS.values()))
def test_helm_lint_passes_strict_for_each_variant(values_file: str) -> None:
    args = () if values_file == "values.yaml" else ("-f", str(CHART / values_file))
    out = _helm("lint", *args)
    assert out.returncode == 0, out.stderr
    assert "[WARNING]" not in out.stderr and "[ERROR]" not in out.stderr


@pytest.mark.parametrize(("variant", "values_file"), VARIANTS.items())
def test_each_variant_renders_the_objects_kustomize_renders(
    variant: str, values_file: str | None
) -> None:
    chart = template(*_values_args(values_file), "--set", "createNamespace=true")
    kustomize = render(variant)
    for obj in kustomize:
        if obj["kind"] == "Namespace":
            obj["metadata"]["labels"].pop(INSTANCE, None)
    helm = _by_name([_as_kustomize_would(o) for o in chart])
    wanted = _by_name(kustomize)
    assert sorted(helm) == sorted(wanted)
    for key, obj in wanted.items():
        assert helm[key] == obj, f"{variant}: {key[0]}/{key[1]} differs from the chart's"


def test_the_namespace_is_left_to_helm_install_create_namespace_by_default() -> None:
    kinds = sorted(o["kind"] for o in template())
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "DaemonSet",
        "ServiceAccount",
    ]


def test_namespaced_objects_and_the_binding_follow_the_release_namespace() -> None:
    objs = template("-n", "gpus")
    namespaced = [o for o in objs if o["kind"] not in ("ClusterRole", "ClusterRoleBinding")]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"gpus"}
    assert only(objs, "ClusterRoleBinding")["subjects"][0]["namespace"] == "gpus"


def test_gpu_and_roce_releases_share_no_object_and_select_only_their_own_pods() -> None:
    gpu = template(*_values_args(VARIANTS["daemonset/overlays/gpu-only"]))
    roce = template(*_values_args(VARIANTS["daemonset/overlays/roce-only"]))
    assert not set(_by_name(gpu)) & set(_by_name(roce))
    selectors = [only(o, "DaemonSet")["spec"]["selector"]["matchLabels"] for o in (gpu, roce)]
    assert selectors[0] != selectors[1]


def test_named_configs_are_files_under_one_directory_and_the_default_is_read() -> None:
    objs = template(
        "--set", "config.map.mig-mixed=version: v1",
        "--set", "config.map.plain=version: v1",
        "--set", "config.default=plain",
    )  # fmt: skip
    configmap = only(objs, "ConfigMap")
    assert sorted(configmap["data"]) == ["mig-mixed", "plain"]
    container = agent_container(objs)
    # Several configs: each node's label chooses, as NVIDIA's config manager lets it.
    assert "--config" not in container["args"]
    assert flag(container["args"], "--config-dir") == "/etc/node-agents/configs"
    assert flag(container["args"], "--config-default") == "plain"
    assert flag(container["args"], "--config-label") == "nvidia.com/device-plugin.config"
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    assert mount == {"name": "config", "mountPath": "/etc/node-agents/configs", "readOnly": True}
    (volume,) = [v for v in pod_spec(objs)["volumes"] if v["name"] == "config"]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]


def test_one_named_config_is_the_default_without_naming_it() -> None:
    objs = template("--set", "config.map.only-one=version: v1")
    assert flag(agent_container(objs)["args"], "--config") == "/etc/node-agents/configs/only-one"


def test_mig_strategy_is_written_into_every_config_and_the_agent_accepts_them() -> None:
    objs = template(
        "--set", "config.map.default=version: v1",
        "--set", "config.map.shared=version: v1\nflags:\n  plugin:\n    deviceIDStrategy: uuid",
        "--set", "migStrategy=mixed",
        "--set", "deviceIDStrategy=index",
    )  # fmt: skip
    for name, text in only(objs, "ConfigMap")["data"].items():
        config = parse_config(text, name)
        assert config.flags.mig_strategy == "mixed", name
        assert config.flags.device_id_strategy == "index", name


def test_the_shipped_config_is_kept_verbatim_unless_a_flag_is_set() -> None:
    shipped = (CHART / "files" / "config.yaml").read_text()
    assert only(template(), "ConfigMap")["data"] == {"default": shipped}
    changed = only(template("--set", "migStrategy=single"), "ConfigMap")
    assert yaml.safe_load(changed["data"]["default"])["flags"]["migStrategy"] == "single"
    # A different config is a differently named ConfigMap: the DaemonSet rolls.
    assert changed["metadata"]["name"] != only(template(), "ConfigMap")["metadata"]["name"]


def test_an_existing_configmap_is_mounted_by_name_and_none_is_made() -> None:
    objs = template("--set", "config.name=site-configs")
    assert [o for o in objs if o["kind"] == "ConfigMap"] == []
    (volume,) = [v for v in pod_spec(objs)["volumes"] if v["name"] == "config"]
    assert volume["configMap"] == {"name": "site-configs"}
    assert flag(agent_container(objs)["args"], "--config-dir") == "/etc/node-agents/configs"
    assert flag(agent_container(objs)["args"], "--config-default") == "default"


def test_a_config_chosen_by_label_may_read_and_watch_its_node_and_one_config_may_not() -> None:
    def node_reads(*args: str) -> list[object]:
        (role,) = [o for o in template(*args) if o["kind"] == "ClusterRole"]
        return [r for r in role["rules"] if r["resources"] == ["nodes"] and "get" in r["verbs"]]

    read = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch"]}
    assert node_reads() == []
    assert node_reads("--set", "config.name=site-configs") == [read]
    label = ("--set", "config.name=site-configs", "--set", "config.label=example.com/cfg")
    assert flag(agent_container(template(*label))["args"], "--config-label") == "example.com/cfg"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--set", "config.name=x", "--set", "migStrategy=single"), "not with config.name"),
        (("--set", "config.name=x", "--set", f"config.map.a={V1}"), "not both"),
        (("--set", f"config.map.a={V1}", "--set", f"config.map.b={V1}"), "name the config to read"),
        (("--set", f"config.map.a={V1}", "--set", "config.default=b"), '"b" is not in config.map'),
        (("--set", "config.map.a=[unclosed"), "config.map.a is not YAML"),
        (("--set", "config.map.a=just text"), "config.map.a is not YAML"),
        (("--set", "api=dra", "--set", "migStrategy=mixed"), "no effect with api: dra"),
        (("--set", "migStrategy=both"), "/migStrategy"),
        (("--set", "families={gpu,nvidia}"), "/families"),
        (("--set", "api=grpc"), "/api"),
        (("--set", "metrics.port=0"), "/metrics/port"),
        (("--set", "nodeselector.a=b"), "'nodeselector' not allowed"),
        (("--set", "mps.enabled=true", "--set", "families={roce}"), "families has no gpu"),
        (("--set", "mps.root=run/mps"), "/mps/root"),
    ],
)
def test_bad_values_are_refused_with_the_reason(args: tuple[str, ...], message: str) -> None:
    assert message in refused(*args)


def test_nvidia_value_names_reach_the_pod_spec() -> None:
    objs = template(
        "--set", "image.repository=registry.local/node-agent",
        "--set", "image.tag=1.2.3",
        "--set", "image.pullPolicy=Always",
        "--set", "nodeSelector.pool=gpu-a",
        "--set-string", "nodeSelector.node-agents\\.io/gpu-node=true",
        "--set", "tolerations[0].key=dedicated",
        "--set", "tolerations[0].operator=Exists",
        "--set", "resources.limits.memory=256Mi",
        "--set", "priorityClassName=gpu-critical",
        "--set", "runtimeClassName=nvidia",
        "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].key=pool",
        "--set", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        "--set", "metrics.port=9500",
        "--set", "extraArgs={--dra-device-taints}",
    )  # fmt: skip
    spec, container = pod_spec(objs), agent_container(objs)
    assert container["image"] == "registry.local/node-agent:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert spec["nodeSelector"] == {"pool": "gpu-a", "node-agents.io/gpu-node": "true"}
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert container["resources"]["limits"] == {"memory": "256Mi"}
    assert spec["priorityClassName"] == "gpu-critical"
    assert spec["runtimeClassName"] == "nvidia"
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}
    ]
    assert flag(container["args"], "--metrics-address") == "$(POD_IP):9500"
    assert container["ports"][0]["containerPort"] == 9500
    assert container["args"][-1] == "--dra-device-taints"


def test_capabilities_are_net_raw_with_roce_and_mknod_in_the_lab_only() -> None:
    def capabilities(*args: str) -> object:
        return agent_container(template(*args))["securityContext"]["capabilities"]

    assert capabilities() == {"drop": ["ALL"], "add": ["NET_RAW"]}
    assert capabilities("--set", "lab.enabled=true") == {
        "drop": ["ALL"],
        "add": ["NET_RAW", "MKNOD"],
    }
    # Without the RoCE family nothing listens for LLDP: no capability at all.
    assert capabilities("--set", "families={gpu}") == {"drop": ["ALL"]}
    # What the values add themselves is kept, once.
    assert capabilities("--set", "securityContext.capabilities.add={NET_RAW}") == {
        "drop": ["ALL"],
        "add": ["NET_RAW"],
    }


def test_label_node_and_its_patch_on_nodes_come_and_go_together() -> None:
    def rights(*args: str) -> list[object]:
        (role,) = [o for o in template(*args) if o["kind"] == "ClusterRole"]
        return [r for r in role["rules"] if r["resources"] == ["nodes"]]

    node_patch = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}
    assert "--label-node" in agent_container(template())["args"]
    assert rights() == [node_patch]
    off = ("--set", "fabric.labelNode=false")
    assert "--label-node" not in agent_container(template(*off))["args"]
    assert rights(*off) == []
    assert rights("--set", "families={gpu}") == []


def test_hack_helm_says_how_to_install_real_helm_when_it_is_missing() -> None:
    env = {**os.environ, "NODE_AGENTS_HELM_VENV": "/nonexistent-helm-venv"}
    out = subprocess.run(
        [sys.executable, str(REPO / "hack" / "helm"), "template"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=30,
    )
    assert out.returncode == 2
    assert "hack/helm setup" in out.stderr


def test_mps_runs_privileged_in_the_hosts_pid_namespace_with_its_root_at_the_same_path() -> None:
    objs = template("--set", "mps.enabled=true", "--set", "mps.root=/var/run/mps")
    spec, container = pod_spec(objs), agent_container(objs)
    assert spec["hostPID"] is True
    ctx = container["securityContext"]
    assert ctx["privileged"] is True and ctx["readOnlyRootFilesystem"] is True
    assert {"name": "mps-root", "mountPath": "/var/run/mps"} in container["volumeMounts"]
    volume = {"name": "mps-root", "hostPath": {"path": "/var/run/mps", "type": "DirectoryOrCreate"}}
    assert volume in spec["volumes"]
    off = template()
    assert pod_spec(off)["hostPID"] is False
    assert agent_container(off)["securityContext"]["privileged"] is False
