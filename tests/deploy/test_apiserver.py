"""Each kustomize variant as a real apiserver takes it: `kubectl apply --dry-run=server`,
which runs the apiserver's own defaulting, validation and admission without persisting
anything. Collected only where KUBECONFIG is set (conftest.py), and then it must reach
the apiserver; the schema tests check the supported versions everywhere else."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest
import yaml

from tests.deploy.manifests import DAEMONSET_DIR, VARIANTS, kubectl, render

TIMEOUT_S = 60


def run_kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl(), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def scratch_namespace() -> Iterator[str]:
    """A namespace of its own for the namespaced objects (a dry run of the Namespace
    creates nothing, and the others need theirs to exist); deleted afterwards."""
    ready = run_kubectl("get", "--raw", "/readyz", "--request-timeout=10s")
    if ready.returncode != 0:
        pytest.fail(f"no apiserver reachable through kubectl: {ready.stderr.strip()[:200]}")
    name = f"node-agents-dry-run-{uuid.uuid4().hex[:8]}"
    created = run_kubectl("create", "namespace", name)
    assert created.returncode == 0, created.stderr
    try:
        yield name
    finally:
        run_kubectl("delete", "namespace", name, "--wait=false")


# daemonset/dra needs resource.k8s.io/v1 (Kubernetes >= 1.34) for its DeviceClasses.
@pytest.mark.parametrize(
    "variant",
    [
        *VARIANTS,
        "daemonset/dra",
        "daemonset/overlays/per-node-config",
        "daemonset/overlays/mps",
        "daemonset/overlays/dra-mps",
    ],
)
def test_apiserver_accepts_every_object_in_a_server_side_dry_run(
    variant: str, scratch_namespace: str
) -> None:
    objs = render(variant)
    for obj in objs:
        if obj["kind"] != "Namespace":
            obj["metadata"]["namespace"] = scratch_namespace
    out = run_kubectl(
        "apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(objs, sort_keys=False)
    )
    print(out.stdout)
    assert out.returncode == 0, f"{variant}: {out.stderr}"
    lines = out.stdout.splitlines()
    assert len(lines) == len(objs)
    assert all(line.endswith("(server dry run)") for line in lines), lines


def test_apiserver_accepts_the_dra_examples_in_a_server_side_dry_run(
    scratch_namespace: str,
) -> None:
    docs = [
        yaml.safe_load(path.read_text())
        for path in sorted((DAEMONSET_DIR / "dra" / "examples").glob("*.yaml"))
    ]
    # A pod is admitted only with its namespace's default account, which the
    # controller-manager makes; an apiserver alone (no controllers) has none.
    run_kubectl("create", "serviceaccount", "default", "-n", scratch_namespace)
    out = run_kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        scratch_namespace,
        "-f",
        "-",
        stdin=yaml.safe_dump_all(docs, sort_keys=False),
    )
    print(out.stdout)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == len(docs)
