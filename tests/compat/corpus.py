"""The compatibility corpus: configs written in NVIDIA's device-plugin format (configs/),
what each must do (cases.yaml), and the expected Allocate answer worked out from the
devices the kubelet chose."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agents.sim.bundled import bundled_node

HERE = Path(__file__).parent
CONFIGS = HERE / "configs"
REPLICA_SEPARATOR = "::"
RESPONSE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
LIST_FIELDS = ("mounts", "devices", "cdi_devices")
MAP_FIELDS = ("envs", "annotations")


@dataclass(frozen=True)
class Request:
    resource: str
    count: int
    refused: str | None = None


@dataclass(frozen=True)
class Case:
    name: str
    config: Path
    node: str
    registered: dict[str, int] = field(default_factory=dict)
    ids: str | None = None
    ignored: tuple[str, ...] = ()
    logged: tuple[str, ...] = ()
    cli: bool = False
    allocate: tuple[Request, ...] = ()
    expect: dict[str, Any] | None = None
    gpus_used: int | None = None
    exit: int | None = None
    key: str = ""
    expected: str = ""

    @property
    def node_file(self) -> Path:
        return bundled_node(self.node)


def load_cases() -> list[Case]:
    raw: list[dict[str, Any]] = yaml.safe_load((HERE / "cases.yaml").read_text())
    cases = []
    for given in raw:
        item = dict(given)
        config = CONFIGS / item.pop("config")
        item.setdefault("name", config.stem)
        item["allocate"] = tuple(Request(**r) for r in item.get("allocate", ()))
        item["ignored"] = tuple(item.get("ignored", ()))
        item["logged"] = tuple(item.get("logged", ()))
        cases.append(Case(config=config, **item))
    return cases


CASES = load_cases()
SERVED = [c for c in CASES if c.exit is None]
REFUSED = [c for c in CASES if c.exit is not None]


class NodeNames:
    """What a container may be told of each device ID of a simulated node: its GPU or
    MIG UUID, or its index (`2`, `0:1` for MIG), and the minor of its physical GPU."""

    def __init__(self, node_file: Path) -> None:
        doc = yaml.safe_load(node_file.read_text())
        self.uuid: dict[str, str] = {}
        self.index: dict[str, str] = {}
        self.gpu: dict[str, str] = {}
        self.minor: dict[str, int] = {}
        for i, gpu in enumerate(doc["gpus"]):
            self._add(gpu["uuid"], str(i), gpu["uuid"])
            self.minor[gpu["uuid"]] = gpu.get("minor", 0)
            for j, mig in enumerate((gpu.get("mig") or {}).get("instances") or ()):
                self._add(mig["uuid"], f"{i}:{j}", gpu["uuid"])

    def _add(self, uuid: str, index: str, gpu: str) -> None:
        self.uuid[uuid], self.index[uuid], self.gpu[uuid] = uuid, index, gpu

    @staticmethod
    def base(device_id: str) -> str:
        return device_id.split(REPLICA_SEPARATOR, 1)[0]

    def told(self, device_ids: list[str], how: str) -> list[str]:
        names = self.index if how == "index" else self.uuid
        return list(dict.fromkeys(names[self.base(d)] for d in device_ids))

    def gpus(self, device_ids: list[str]) -> list[str]:
        return list(dict.fromkeys(self.gpu[self.base(d)] for d in device_ids))


def answer_fields(response: Any) -> dict[str, Any]:
    """A ContainerAllocateResponse as plain data, a fresh response ID shown as {response}."""
    return {
        "envs": dict(response.envs),
        "mounts": [
            {"container_path": m.container_path, "host_path": m.host_path, "read_only": m.read_only}
            for m in response.mounts
        ],
        "devices": [
            {
                "container_path": d.container_path,
                "host_path": d.host_path,
                "permissions": d.permissions,
            }
            for d in response.devices
        ],
        "annotations": {
            RESPONSE_ID.sub("{response}", k): v for k, v in response.annotations.items()
        },
        "cdi_devices": [d.name for d in response.cdi_devices],
    }


def expected_fields(
    expect: dict[str, Any], told: list[str], minors: list[int], sim_root: str
) -> dict[str, Any]:
    """The answer `expect` describes for a container told `told` about GPUs of `minors`."""
    words = {
        "{told}": ",".join(told),
        "{cdi}": ",".join(f"nvidia.com/gpu={n}" for n in told),
        "{sim}": sim_root,
    }

    def fill(text: str, **more: str) -> str:
        for key, value in {**words, **{f"{{{k}}}": v for k, v in more.items()}}.items():
            text = text.replace(key, value)
        return text

    def items(template: list[Any]) -> list[Any]:
        out: list[Any] = []
        for item in template:
            text = yaml.safe_dump(item)
            if "{each}" in text:
                out += [_fill_all(item, fill, each=n) for n in told]
            elif "{minor}" in text:
                out += [_fill_all(item, fill, minor=str(m)) for m in minors]
            else:
                out.append(_fill_all(item, fill))
        return out

    want: dict[str, Any] = {}
    for name in LIST_FIELDS:
        want[name] = items(expect.get(name) or [])
    for name in MAP_FIELDS:
        want[name] = {fill(k): fill(v) for k, v in (expect.get(name) or {}).items()}
    return want


def _fill_all(item: Any, fill: Any, **more: str) -> Any:
    if isinstance(item, str):
        return fill(item, **more)
    if isinstance(item, dict):
        return {k: _fill_all(v, fill, **more) for k, v in item.items()}
    return item


def unordered(fields: dict[str, Any]) -> dict[str, Any]:
    """The answer with every list and comma-separated value sorted: the kubelet passes the
    device IDs in no particular order, so the order of the names means nothing either."""

    def value(v: str) -> str:
        return ",".join(sorted(v.split(","))) if "," in v else v

    out: dict[str, Any] = {}
    for name in MAP_FIELDS:
        out[name] = {k: value(v) for k, v in fields[name].items()}
    for name in LIST_FIELDS:
        out[name] = sorted(fields[name], key=repr)
    return out


SIM_ROOT = re.compile(r"^(/.*/node-agent-sim-[^/]+)/")


def simulator_root(fields: dict[str, Any]) -> str:
    """The simulator's root as the host paths of an answer show it ("" if none does)."""
    for spec in fields["devices"]:
        found = SIM_ROOT.match(spec["host_path"])
        if found:
            return found.group(1)
    return ""
