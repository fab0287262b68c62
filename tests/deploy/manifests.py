"""Rendering the kustomize variants in daemonset/ into objects, for the deploy tests."""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DAEMONSET_DIR = REPO / "daemonset"
VARIANTS = ("daemonset", "daemonset/overlays/gpu-only", "daemonset/overlays/roce-only")

Obj = dict[str, Any]


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        why = "kubectl is not installed: `kubectl kustomize` renders daemonset/"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return found


@functools.cache
def _render(variant: str) -> tuple[Obj, ...]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(REPO / variant)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert out.returncode == 0, f"kubectl kustomize {variant} failed:\n{out.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(out.stdout) if doc)


def render(variant: str) -> list[Obj]:
    """The objects `kubectl apply -k <variant>` would send, as fresh dicts."""
    return copy.deepcopy(list(_render(variant)))


def only(objs: list[Obj], kind: str) -> Obj:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"expected exactly one {kind}, got {len(found)}"
    return found[0]


def pod_spec(objs: list[Obj]) -> Obj:
    spec: Obj = only(objs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def agent_container(objs: list[Obj]) -> Obj:
    containers = pod_spec(objs)["containers"]
    assert [c["name"] for c in containers] == ["node-agent"]
    container: Obj = containers[0]
    return container


def required_flag(args: list[str], name: str) -> str:
    """The value of `--name`, which the args must have."""
    value = flag(args, name)
    assert value is not None, f"{name} is not set"
    return value


def flag(args: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE` in args; None when absent."""
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None
