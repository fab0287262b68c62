"""The claims a driver has prepared, kept in a checksummed file in its plugins directory:
enough to answer a repeated prepare alike and to write the claims' CDI specs again."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.atomic_file import write_atomically
from agents.core.device import DeviceNode, Mount
from agents.errors import AgentError

VERSION = 1
CHECKPOINT = "checkpoint.json"
CHECKPOINT_MODE = 0o600


class CheckpointError(AgentError):
    """The checkpoint cannot be read: unreadable, not JSON, another version, or a checksum
    that does not match. A corrupt file has been moved aside to `kept` (None if not)."""

    def __init__(self, path: Path, reason: str, kept: Path | None = None) -> None:
        self.path = path
        self.reason = reason
        self.kept = kept
        aside = f" (kept as {kept})" if kept is not None else ""
        super().__init__(f"{path}: {reason}{aside}")


@dataclass(frozen=True)
class PreparedDevice:
    """One result of a claim as prepared: what NodePrepareResources answered for it, and
    the device nodes its CDI device passes into the container."""

    device: str
    requests: tuple[str, ...]
    pool: str
    cdi_ids: tuple[str, ...]
    nodes: tuple[DeviceNode, ...] = ()
    admin_access: bool = False
    resource: str = ""  # the family resource that served it, and its ID there: what the
    device_id: str = ""  # device-plugin API must not hand out while the claim holds it
    share_id: str = ""  # one share of a device other claims may share too; "" whole
    consumed: Mapping[str, str] = field(default_factory=dict)  # what the share takes

    @property
    def cdi_name(self) -> str:
        return share_name(self.device, self.share_id)


def share_name(device: str, share_id: str) -> str:
    """A prepared device's CDI device name after the claim UID: the device, and its share."""
    return f"{device}-{share_id}" if share_id else device


@dataclass(frozen=True)
class PreparedClaim:
    """A prepared claim: its name, its devices of this driver and their environment."""

    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()  # every container of the claim gets, with its env


class ClaimCheckpoint:
    """The file at `path`. Blocking file I/O: call it off the event loop."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def corrupt_path(self) -> Path:
        return self.path.with_name(self.path.name + ".corrupt")

    def load(self) -> dict[str, PreparedClaim]:
        """Claim UID -> prepared claim; empty when there is no file. CheckpointError when
        it cannot be used, after moving a corrupt file aside (replacing an older copy)."""
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CheckpointError(self.path, f"unreadable: {exc}") from exc
        try:
            return decode(text, self.path)
        except CheckpointError as exc:
            raise CheckpointError(self.path, exc.reason, self._set_aside()) from exc

    def _set_aside(self) -> Path | None:
        try:
            self.path.replace(self.corrupt_path)
        except OSError:
            return None
        return self.corrupt_path

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        write_atomically(self.path, encode(claims), CHECKPOINT_MODE)


def encode(claims: Mapping[str, PreparedClaim]) -> bytes:
    data = {"claims": {uid: _claim_data(claim) for uid, claim in sorted(claims.items())}}
    document = {"version": VERSION, "checksum": _checksum(data), "data": data}
    return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()


def decode(text: bytes, where: Path) -> dict[str, PreparedClaim]:
    """Raises CheckpointError for anything that `encode` did not write."""
    try:
        document = json.loads(text)
    except ValueError as exc:  # UnicodeDecodeError included
        raise CheckpointError(where, f"not JSON: {exc}") from exc
    if not isinstance(document, dict) or document.get("version") != VERSION:
        version = document.get("version") if isinstance(document, dict) else None
        raise CheckpointError(where, f"version {version!r}, expected {VERSION}")
    data: Any = document.get("data")
    if document.get("checksum") != _checksum(data):
        raise CheckpointError(where, "checksum does not match the contents")
    try:
        return {_str(uid): _claim(claim) for uid, claim in data["claims"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(where, f"malformed claim: {exc!r}") from exc


def _checksum(data: Any) -> str:
    # Imported here: hashlib brings OpenSSL's libcrypto in, and device-plugin mode loads
    # this module only to learn the checkpoint's file name.
    import hashlib

    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _claim_data(claim: PreparedClaim) -> dict[str, Any]:
    data: dict[str, Any] = {
        "namespace": claim.namespace,
        "name": claim.name,
        "env": dict(claim.env),
        "devices": [_device_data(d) for d in claim.devices],
    }
    if claim.mounts:  # written only where there are: older files stay as they were
        data["mounts"] = [[m.container_path, m.host_path, m.read_only] for m in claim.mounts]
    return data


def _device_data(device: PreparedDevice) -> dict[str, Any]:
    n = device.nodes
    data: dict[str, Any] = {
        "device": device.device,
        "requests": list(device.requests),
        "pool": device.pool,
        "cdiIDs": list(device.cdi_ids),
        "nodes": [[node.container_path, node.host_path, node.permissions] for node in n],
        "adminAccess": device.admin_access,
        "resource": device.resource,
        "deviceID": device.device_id,
    }
    if device.share_id:
        data |= {"shareID": device.share_id, "consumed": dict(device.consumed)}
    return data


def _claim(data: dict[str, Any]) -> PreparedClaim:
    env = data["env"]
    if not isinstance(env, dict):
        raise TypeError("env is not a map")
    return PreparedClaim(
        namespace=_str(data["namespace"]),
        name=_str(data["name"]),
        devices=tuple(_device(d) for d in _list(data["devices"])),
        env={_str(key): _str(value) for key, value in env.items()},
        mounts=tuple(_mount(m) for m in _list(data.get("mounts", []))),
    )


def _mount(data: Any) -> Mount:
    inside, host, read_only = _list(data)
    if not isinstance(read_only, bool):
        raise TypeError("a mount's read_only is not a boolean")
    return Mount(_str(inside), _str(host), read_only)


def _device(data: dict[str, Any]) -> PreparedDevice:
    if not isinstance(data["adminAccess"], bool):
        raise TypeError("adminAccess is not a boolean")
    return PreparedDevice(
        device=_str(data["device"]),
        requests=_strings(data["requests"]),
        pool=_str(data["pool"]),
        cdi_ids=_strings(data["cdiIDs"]),
        nodes=tuple(DeviceNode(*_strings(node)) for node in _list(data["nodes"])),
        admin_access=data["adminAccess"],
        resource=_str(data.get("resource", "")),
        device_id=_str(data.get("deviceID", "")),
        share_id=_str(data.get("shareID", "")),
        consumed=_strings_map(data.get("consumed", {})),
    )


def _strings_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise TypeError(f"{value!r} is not a map")
    return {_str(k): _str(v) for k, v in value.items()}


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"{value!r} is not a list")
    return value


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(_str(item) for item in _list(value))


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value
