"""MPS in the deployment (daemonset/components/mps, overlays/mps and overlays/dra-mps, the
chart's mps values): the host's PID namespace, privileged, and flags.mpsRoot from the host
at the same path, so that the agent starts the MPS daemon outside its own container; and
nothing else differs from the variant it is added to."""

from __future__ import annotations

import pytest

from agents.config_shares import MPS_ROOT
from tests.deploy.manifests import Obj, agent_container, only, pod_spec, render

PAIRS = {"daemonset/overlays/mps": "daemonset", "daemonset/overlays/dra-mps": "daemonset/dra"}
MOUNT = {"name": "mps-root", "mountPath": MPS_ROOT}
VOLUME = {"name": "mps-root", "hostPath": {"path": MPS_ROOT, "type": "DirectoryOrCreate"}}


def without_mps(objs: list[Obj]) -> list[Obj]:
    """`objs` with what the component adds undone, checking each addition on the way."""
    spec = pod_spec(objs)
    assert spec.pop("hostPID") is True
    spec["hostPID"] = False
    container = agent_container(objs)
    ctx = container["securityContext"]
    assert ctx["privileged"] is True and ctx["allowPrivilegeEscalation"] is True
    assert ctx["readOnlyRootFilesystem"] is True  # still
    ctx["privileged"] = ctx["allowPrivilegeEscalation"] = False
    assert container["volumeMounts"].pop() == MOUNT
    assert spec["volumes"].pop() == VOLUME
    return objs


@pytest.mark.parametrize(("variant", "base"), PAIRS.items())
def test_mps_adds_host_pid_privilege_and_the_mps_root_and_nothing_else(
    variant: str, base: str
) -> None:
    assert without_mps(render(variant)) == render(base)


@pytest.mark.parametrize("version", ["1.26.0", "1.31.0"])
@pytest.mark.parametrize("variant", PAIRS)
def test_the_daemonset_with_mps_matches_the_strict_kubernetes_schema(
    variant: str, version: str
) -> None:
    validate = pytest.importorskip("kubernetes_validate").validate
    validate(only(render(variant), "DaemonSet"), version, strict=True)
