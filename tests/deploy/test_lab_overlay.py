"""daemonset/lab: the base on a simulated node, and nothing more. The overlay adds the
simulator's flags, its root as a hostPath at the same path, CAP_MKNOD and a local image;
every other field, the security context included, is the base's."""

from __future__ import annotations

import pytest

from agents.command_line import parse_args
from agents.sim.bundled import bundled_nodes
from tests.deploy.manifests import Obj, agent_container, flag, only, pod_spec, render

LAB = "daemonset/lab"
BASE = "daemonset"
SIM_ROOT = "/var/lib/node-agent-sim"
SIM_ARGS = ["--simulate", "h100-8gpu-8nic", "--simulate-root", SIM_ROOT]


def _volume(objs: list[Obj], name: str) -> Obj:
    found: Obj
    (found,) = [v for v in pod_spec(objs)["volumes"] if v["name"] == name]
    return found


def test_lab_runs_a_bundled_simulated_node_rooted_in_a_hostpath_at_the_same_path() -> None:
    objs = render(LAB)
    container = agent_container(objs)
    args = container["args"]
    assert args[-4:] == SIM_ARGS
    assert flag(args, "--simulate") in bundled_nodes()
    opts = parse_args(args)
    assert str(opts.simulate_root) == SIM_ROOT
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == SIM_ROOT]
    assert not mount.get("readOnly", False)  # the simulator makes its tree there
    assert _volume(objs, mount["name"])["hostPath"] == {
        "path": SIM_ROOT,
        "type": "DirectoryOrCreate",
    }


def test_lab_adds_only_mknod_and_keeps_every_other_security_setting_of_the_base() -> None:
    lab = agent_container(render(LAB))["securityContext"]
    base = agent_container(render(BASE))["securityContext"]
    assert base["capabilities"] == {"drop": ["ALL"], "add": ["NET_RAW"]}  # LLDP, nothing else
    assert lab["capabilities"] == {"drop": ["ALL"], "add": ["NET_RAW", "MKNOD"]}
    lab.pop("capabilities")
    base.pop("capabilities")
    assert lab == base
    assert pod_spec(render(LAB)).get("securityContext") == pod_spec(render(BASE)).get(
        "securityContext"
    )


def test_lab_uses_the_local_image_and_never_pulls() -> None:
    container = agent_container(render(LAB))
    assert container["image"] == "localhost/node-agent:dev"  # hack/image's default tag
    assert container["imagePullPolicy"] == "Never"


def test_lab_differs_from_the_base_in_nothing_else() -> None:
    lab, base = render(LAB), render(BASE)
    assert sorted(o["kind"] for o in lab) == sorted(o["kind"] for o in base)
    for kind in ("Namespace", "ServiceAccount", "ConfigMap"):
        assert only(lab, kind) == only(base, kind), kind
    container = agent_container(lab)
    assert container.pop("args")[:-4] == agent_container(base)["args"]
    del container["image"], container["imagePullPolicy"]
    container["securityContext"]["capabilities"]["add"].remove("MKNOD")
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["mountPath"] != SIM_ROOT]
    spec = pod_spec(lab)
    spec["volumes"] = [v for v in spec["volumes"] if v.get("hostPath", {}).get("path") != SIM_ROOT]
    expected = agent_container(base)
    del expected["args"], expected["image"]
    assert container == expected
    daemonset = only(lab, "DaemonSet")
    daemonset["spec"]["template"]["spec"] = {**spec, "containers": [container]}
    wanted = only(base, "DaemonSet")
    wanted["spec"]["template"]["spec"]["containers"] = [expected]
    assert daemonset == wanted


@pytest.mark.parametrize("version", ["1.26.0", "1.31.0"])
def test_lab_objects_match_the_strict_kubernetes_schema(version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for obj in render(LAB):
        kubernetes_validate.validate(obj, version, strict=True)


def test_e2e_overlay_reads_the_simulated_node_from_the_hostpath() -> None:
    # tests/e2e edits this file from a helper pod to inject faults.
    args = agent_container(render("tests/e2e/overlay"))["args"]
    assert args[-2:] == ["--simulate", f"{SIM_ROOT}/node.yaml"]
    assert str(parse_args(args).simulate) == f"{SIM_ROOT}/node.yaml"


def test_k8s_lab_overlay_adds_only_the_token_volume_and_the_api_address() -> None:
    """tests/e2e/k8s-lab: the e2e overlay plus what a minimal cluster lacks."""
    e2e, lab = render("tests/e2e/overlay"), render("tests/e2e/k8s-lab")
    base, added = agent_container(e2e), agent_container(lab)
    env = {e["name"]: e.get("value") for e in added["env"]}
    assert (
        env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1" and env["KUBERNETES_SERVICE_PORT"] == "6443"
    )
    mounts = [m for m in added["volumeMounts"] if m not in base["volumeMounts"]]
    assert mounts == [
        {
            "name": "kube-api-access",
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            "readOnly": True,
        }
    ]
    assert {**added, "env": base["env"], "volumeMounts": base["volumeMounts"]} == base
