"""The CDI spec files of prepared claims: one file per driver and claim, naming one CDI
device per prepared device (its device nodes) and one for the claim's environment."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.atomic_file import write_atomically
from agents.core.device import DeviceNode, Mount

CDI_ROOT = Path("/var/run/cdi")
CDI_VERSION = "0.5.0"  # the first version whose device names may start with a digit
SPEC_MODE = 0o644  # the container runtime reads it, not as our user
ENV_DEVICE = "env"
CLASS = "claim"

_FILE = re.compile(r"^k8s\.(?P<driver>.+)-claim_(?P<uid>[^/]+)\.yaml$")
# CDI's rule for device names: alphanumeric at both ends, [A-Za-z0-9_.:-] between.
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class CdiDevice:
    """One prepared device as its CDI device: the DRA device name and its device nodes."""

    name: str
    nodes: tuple[DeviceNode, ...]


def kind(driver: str) -> str:
    return f"k8s.{driver}/{CLASS}"


def device_id(driver: str, claim_uid: str, device: str) -> str:
    """The fully-qualified CDI ID of one device of a claim's spec."""
    return f"{kind(driver)}={claim_uid}-{device}"


def cdi_ids(
    driver: str,
    claim_uid: str,
    devices: Sequence[CdiDevice],
    env: Mapping[str, str],
    mounts: Sequence[Mount] = (),
) -> dict[str, tuple[str, ...]]:
    """Device name -> the CDI IDs a container of the claim gets for it: its own (where it
    has device nodes) and the claim's environment device (where there is an environment
    or a mount). CDI refuses a device without edits, so neither is written empty."""
    shared = (device_id(driver, claim_uid, ENV_DEVICE),) if env or mounts else ()
    return {
        d.name: ((device_id(driver, claim_uid, d.name),) if d.nodes else ()) + shared
        for d in devices
    }


def spec_document(
    driver: str,
    claim_uid: str,
    devices: Sequence[CdiDevice],
    env: Mapping[str, str],
    mounts: Sequence[Mount] = (),
) -> dict[str, Any]:
    """The spec as a document; ValueError for a name CDI would refuse."""
    entries = [
        {"name": _checked(f"{claim_uid}-{d.name}"), "containerEdits": {"deviceNodes": _nodes(d)}}
        for d in devices
        if d.nodes
    ]
    if env or mounts:
        edits: dict[str, Any] = {"env": [f"{key}={value}" for key, value in env.items()]}
        if mounts:
            edits["mounts"] = [_mount(m) for m in mounts]
        entries.append({"name": _checked(f"{claim_uid}-{ENV_DEVICE}"), "containerEdits": edits})
    return {"cdiVersion": CDI_VERSION, "kind": kind(driver), "devices": entries}


def _nodes(device: CdiDevice) -> list[dict[str, str]]:
    nodes = []
    for spec in device.nodes:
        node = {"path": spec.container_path}
        if spec.host_path != spec.container_path:
            node["hostPath"] = spec.host_path
        node["permissions"] = spec.permissions
        nodes.append(node)
    return nodes


def _mount(mount: Mount) -> dict[str, Any]:
    access = "ro" if mount.read_only else "rw"
    return {
        "hostPath": mount.host_path,
        "containerPath": mount.container_path,
        "options": ["rbind", access],
    }


def _checked(name: str) -> str:
    if not _DEVICE_NAME.match(name):
        raise ValueError(f"{name!r} is not a valid CDI device name")
    return name


class CdiSpecs:
    """The spec files under one CDI root. Blocking file I/O: call it off the event loop."""

    def __init__(self, root: Path = CDI_ROOT) -> None:
        self.root = root

    def path(self, driver: str, claim_uid: str) -> Path:
        return self.root / f"k8s.{driver}-claim_{claim_uid}.yaml"

    def write(
        self,
        driver: str,
        claim_uid: str,
        devices: Sequence[CdiDevice],
        env: Mapping[str, str],
        mounts: Sequence[Mount] = (),
    ) -> dict[str, tuple[str, ...]]:
        """Write (or rewrite) the claim's spec atomically; returns `cdi_ids` of it."""
        document = spec_document(driver, claim_uid, devices, env, mounts)
        import yaml  # DRA mode only

        text = yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
        write_atomically(self.path(driver, claim_uid), text.encode(), SPEC_MODE)
        return cdi_ids(driver, claim_uid, devices, env, mounts)

    def remove(self, driver: str, claim_uid: str) -> bool:
        """Remove the claim's spec; False when there was none (removing twice is fine)."""
        try:
            self.path(driver, claim_uid).unlink()
        except FileNotFoundError:
            return False
        return True

    def written(self, driver: str | None = None) -> list[tuple[str, str]]:
        """(driver, claim UID) of each claim spec present, of one driver or of all, sorted;
        other files under the root (other vendors' specs) are not ours and not listed."""
        try:
            names = [entry.name for entry in self.root.iterdir()]
        except FileNotFoundError:
            return []
        found = [m for m in map(_FILE.match, names) if m is not None]
        return sorted(
            (m["driver"], m["uid"]) for m in found if driver is None or m["driver"] == driver
        )
