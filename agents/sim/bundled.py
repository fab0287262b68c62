"""The node files shipped with the package (agents/sim/nodes/*.yaml)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from agents.errors import ConfigError

DEMO_NODE = "h100-8gpu-8nic"


def bundled_nodes() -> list[str]:
    """Names of the bundled node files, without `.yaml`."""
    nodes = resources.files("agents.sim").joinpath("nodes")
    return sorted(e.name.removesuffix(".yaml") for e in nodes.iterdir() if e.name.endswith(".yaml"))


def bundled_node(name: str) -> Path:
    """The path of a bundled node file, by name (`h100-8gpu-8nic`, `.yaml` optional)."""
    stem = name.removesuffix(".yaml")
    entry = resources.files("agents.sim").joinpath("nodes", f"{stem}.yaml")
    if not entry.is_file():
        raise ConfigError("bundled nodes", name, f"one of {', '.join(bundled_nodes())}")
    return Path(str(entry))
