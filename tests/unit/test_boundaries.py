"""The lines between the parts of agents/ hold: the two kubelet APIs never import each
other, families import neither each other nor a runtime, the shared kernel and core know
no family and no runtime and speak no device-plugin term, and a DRA prepare runs no
device-plugin code (docs/architecture.md)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import agents

ROOT = Path(agents.__file__).parent
FAMILIES = ("gpu", "roce")
RUNTIMES = ("plugin", "dra")
# What only the device-plugin API says: its wire message, the CDI annotation key NVIDIA's
# plugin writes, and the names of the device-list strategies of its config.
PLUGIN_TERMS = (
    *("AllocateResponse", "cdi.k8s.io/"),
    *("envvar", "volume-mounts", "cdi-annotations", "cdi-cri"),
    *("deviceListStrategy", "device_list_strategy"),
)


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (type-only and in-function ones too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def modules(part: str) -> list[Path]:
    return sorted((ROOT / part).glob("*.py"))


def reaches(path: Path, part: str) -> list[str]:
    prefix = f"agents.{part}"
    return sorted(n for n in imported(path) if n == prefix or n.startswith(prefix + "."))


PAIRS = [
    (module, other)
    for part, others in (
        ("plugin", ("dra", *FAMILIES)),
        ("dra", ("plugin", *FAMILIES)),
        ("kernel", (*RUNTIMES, *FAMILIES)),
        ("core", (*RUNTIMES, *FAMILIES, "kernel")),
        *((f, (*RUNTIMES, *(o for o in FAMILIES if o != f))) for f in FAMILIES),
    )
    for module in modules(part)
    for other in others
]


@pytest.mark.parametrize(
    ("module", "other"), PAIRS, ids=[f"{m.parent.name}/{m.name}-{o}" for m, o in PAIRS]
)
def test_a_part_imports_nothing_of_the_parts_it_must_not_know(module: Path, other: str) -> None:
    assert reaches(module, other) == []


SHARED = [m for part in ("kernel", "core", "dra") for m in modules(part)]


@pytest.mark.parametrize("module", SHARED, ids=[f"{m.parent.name}/{m.name}" for m in SHARED])
def test_the_kernel_core_and_dra_speak_no_device_plugin_term(module: Path) -> None:
    text = module.read_text()
    assert [term for term in PLUGIN_TERMS if term in text] == []


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from agents.plugin import wire\n"
        "def f():\n    import agents.dra.cdi\n"
    )
    assert reaches(source, "plugin") == ["agents.plugin", "agents.plugin.wire"]
    assert reaches(source, "dra") == ["agents.dra.cdi"]
    assert "cdi-cri" in PLUGIN_TERMS and len(PAIRS) > 50


# A GPU claim prepared by the DRA driver over the GPU family of the bundled node, with a
# config whose device-plugin keys say the opposite of what DRA does (CDI names only, no
# device nodes): the family's Allocate entry point refuses to run, and the device-plugin
# runtime's modules must not even be loaded.
PREPARE = """
import asyncio, json, sys
from pathlib import Path
from agents.backends import simulated_backends
from agents.config import parse_config
from agents.dra.claims import AllocationResult, Claim
from agents.dra.driver import ClaimRef, ClaimStore, Driver
from agents.family import Context, config_view
from agents.gpu.kind import GpuKind
from agents.gpu.resource import GpuResource
from agents.sim.bundled import bundled_node

def refused(*args, **kwargs):
    raise AssertionError("the device-plugin entry point ran")

GpuResource.allocate = refused
root = Path(sys.argv[1])
text = "version: v1\\nflags:\\n  deviceListStrategy: [cdi-cri]\\n  passDeviceSpecs: false\\n"

class Sink:
    def publish(self, states): pass
    def readings(self, resource, device, values): pass

async def main():
    kind = GpuKind()
    config = kind.named_devices(config_view(kind, parse_config(text, "c.yaml")))
    async with simulated_backends(bundled_node("h100-8gpu-8nic")) as backends:
        found = kind.discover(config, backends, "c.yaml")
        family = kind.build(found, config, Context(backends, Sink(), None))
        facts = family.facts()
        device = facts.devices[0]
        result = AllocationResult("r", facts.driver, "node", device.name)
        claim = Claim("ns", "c", "uid-1", (result,), ())
        async def read(ref):
            return claim
        driver = Driver(facts.driver, "node", ClaimStore(facts.driver, root, root / "cdi"), read)
        driver.publish(facts, {r.name: r for r in family.resources()}, family.edits)
        [prepared] = (await driver.prepare([ClaimRef("ns", "uid-1", "c")])).values()
        await family.close()
    nodes = [n.container_path for d in prepared.devices for n in d.nodes]
    print(json.dumps({"env": dict(prepared.env), "nodes": nodes, "modules": sorted(sys.modules)}))

asyncio.run(main())
"""


def test_a_dra_prepare_runs_no_device_plugin_code(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PREPARE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert [m for m in got["modules"] if m.startswith("agents.plugin")] == []
    assert got["env"]["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
    assert got["nodes"][:3] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert got["nodes"][3].startswith("/dev/nvidia")


def module_graph() -> dict[str, set[str]]:
    """Every module of agents/ (the generated api/ aside) -> the modules of agents/ it
    imports, type-only imports included."""
    paths = {
        ".".join(p.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__"): p
        for p in ROOT.rglob("*.py")
        if p.parent.name != "api"
    }
    return {name: imported(path) & set(paths) for name, path in paths.items()}


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of the graph, or []."""
    done: set[str] = set()

    def walk(name: str, path: list[str]) -> list[str]:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return []
        for other in sorted(graph[name]):
            found = walk(other, [*path, name])
            if found:
                return found
        done.add(name)
        return []

    return next((c for c in (walk(n, []) for n in sorted(graph)) if c), [])


def test_no_module_imports_itself_round_a_cycle_not_even_for_types() -> None:
    assert cycle(module_graph()) == []
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
