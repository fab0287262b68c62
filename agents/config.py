"""The agent's configuration file (SPEC section 3), parsed strictly into frozen dataclasses.

Files of the established v1 config format are accepted unchanged; inert keys are listed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from agents.configschema import (
    EXTENDED_NAME,
    Check,
    ReplicatedDevices,
    SchemaError,
    Section,
    boolean,
    devices,
    duration,
    extended_name,
    gpu_resource,
    integer,
    link_layer,
    list_of,
    load_yaml,
    one_of,
    pci_address,
    shared_name,
    shown,
    string,
    text,
    vendor,
)
from agents.errors import ConfigError

T = TypeVar("T")
MigStrategy = Literal["none", "single", "mixed"]
DeviceIDStrategy = Literal["uuid", "index"]

MIG_STRATEGIES: tuple[MigStrategy, ...] = ("none", "single", "mixed")
DEVICE_ID_STRATEGIES: tuple[DeviceIDStrategy, ...] = ("uuid", "index")
DEVICE_LIST_STRATEGIES = ("envvar", "cdi-cri")
SHARED_SUFFIX = ".shared"


@dataclass(frozen=True)
class Flags:
    mig_strategy: MigStrategy = "none"
    fail_on_init_error: bool = True
    device_id_strategy: DeviceIDStrategy = "uuid"
    device_list_strategy: frozenset[str] = frozenset({"envvar"})
    pass_device_specs: bool = False


@dataclass(frozen=True)
class TimeSlicedResource:
    name: str
    replicas: int
    rename: str | None = None
    devices: ReplicatedDevices = "all"


@dataclass(frozen=True)
class TimeSlicing:
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    resources: tuple[TimeSlicedResource, ...] = ()

    def replicas_for(self, resource_name: str) -> TimeSlicedResource | None:
        """The time-slicing entry for `resource_name`, or None when it is not shared."""
        return next((r for r in self.resources if r.name == resource_name), None)

    def advertised_name(self, resource_name: str) -> str:
        """The name under which `resource_name` is advertised once sharing is applied."""
        entry = self.replicas_for(resource_name)
        if entry is None:
            return resource_name
        if entry.rename is not None:
            return entry.rename
        return resource_name + SHARED_SUFFIX if self.rename_by_default else resource_name


@dataclass(frozen=True)
class Sharing:
    time_slicing: TimeSlicing = field(default_factory=TimeSlicing)


@dataclass(frozen=True)
class RoceSelectors:
    """Which NIC functions are the RoCE family; an empty tuple matches any."""

    vendors: tuple[str, ...] = ("15b3",)
    if_names: tuple[str, ...] = ()
    link_layers: tuple[str, ...] = ("Ethernet",)
    pci_addresses: tuple[str, ...] = ()
    rdma_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Roce:
    resource_name: str = "rdma/roce"
    selectors: RoceSelectors = field(default_factory=RoceSelectors)


@dataclass(frozen=True)
class Pairing:
    enabled: bool = True


@dataclass(frozen=True)
class Health:
    disabled_xids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Config:
    version: str = "v1"
    flags: Flags = field(default_factory=Flags)
    sharing: Sharing = field(default_factory=Sharing)
    roce: Roce = field(default_factory=Roce)
    pairing: Pairing = field(default_factory=Pairing)
    health: Health = field(default_factory=Health)
    ignored_keys: tuple[str, ...] = ()
    """Key paths accepted for compatibility that have no effect here (to be logged once)."""

    @classmethod
    def default(cls) -> Config:
        return cls()


def load_config(path: Path) -> Config:
    """Read and parse the file at `path`; an unreadable file is a ConfigError too."""
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(str(path), "(file)", f"a readable UTF-8 file ({err})") from err
    return parse_config(content, str(path))


def parse_config(text_: str, source: str) -> Config:
    """Parse a config document; an empty one gives the defaults."""
    try:
        return _config(load_yaml(text_))
    except SchemaError as err:
        one_line = " ".join(err.expected.splitlines())
        raise ConfigError(source, err.path or "(document)", one_line) from None


def _config(raw: object) -> Config:
    top = Section(raw, "", _TOP_KEYS, ignored=[])
    version = top.value("version", one_of(("v1",)), "v1")
    flags = _flags(top.section("flags", _FLAG_KEYS))
    sharing = Sharing(_shared(top.section("sharing", ("timeSlicing", "mps"))))
    _refuse_pattern_renames(top.section("resources", ("gpus", "mig")))
    _refuse_imex_channels(top.section("imex", ("channelIDs", "required")))
    top.ignored.extend(key for key in ("resources", "imex") if top.has(key))
    roce = _roce(top.section("roce", ("resourceName", "selectors")))
    pairing = Pairing(top.section("pairing", ("enabled",)).value("enabled", boolean, True))
    health = top.section("health", ("disabledXids",))
    xids = health.value("disabledXids", list_of(integer(1)), tuple[int, ...]())
    return Config(
        version, flags, sharing, roce, pairing, Health(frozenset(xids)), tuple(top.ignored)
    )


_TOP_KEYS = ("version", "flags", "sharing", "roce", "pairing", "health", "resources", "imex")
_PLUGIN_KEYS = ("passDeviceSpecs", "deviceListStrategy", "deviceIDStrategy")
_PLUGIN_ONLY_KEYS = ("cdiAnnotationPrefix", "nvidiaCTKPath", "containerDriverRoot")
_COMPAT_FLAG_PATHS = ("nvidiaDriverRoot", "nvidiaDevRoot", "mpsRoot", "deviceDiscoveryStrategy")
_COMPAT_FLAG_BOOLS = ("gdsEnabled", "mofedEnabled", "useNodeFeatureAPI")
_FLAG_KEYS = (
    *("migStrategy", "failOnInitError", "plugin", "gfd"),
    *(_PLUGIN_KEYS + _COMPAT_FLAG_PATHS + _COMPAT_FLAG_BOOLS),
)


_GFD_KEYS: dict[str, Check[object]] = {
    "oneshot": boolean,
    "noTimestamp": boolean,
    "sleepInterval": duration,
    "outputFile": string,
    "machineTypeFile": string,
}


def _device_lists(value: object) -> frozenset[str]:
    return frozenset(list_of(one_of(DEVICE_LIST_STRATEGIES), nonempty=True, single=True)(value))


def _flags(sec: Section) -> Flags:
    plugin = sec.section("plugin", _PLUGIN_KEYS + _PLUGIN_ONLY_KEYS)
    for key in _PLUGIN_ONLY_KEYS:
        plugin.ignore(key, string)
    for key in _COMPAT_FLAG_PATHS:
        sec.ignore(key, string)
    for key in _COMPAT_FLAG_BOOLS:
        sec.ignore(key, boolean)
    gfd = sec.section("gfd", tuple(_GFD_KEYS))
    for key, check in _GFD_KEYS.items():
        gfd.ignore(key, check)
    return Flags(
        mig_strategy=sec.value("migStrategy", one_of(MIG_STRATEGIES), "none"),
        fail_on_init_error=sec.value("failOnInitError", boolean, True),
        device_id_strategy=_either(
            sec, plugin, "deviceIDStrategy", one_of(DEVICE_ID_STRATEGIES), "uuid"
        ),
        device_list_strategy=_either(
            sec, plugin, "deviceListStrategy", _device_lists, frozenset({"envvar"})
        ),
        pass_device_specs=_either(sec, plugin, "passDeviceSpecs", boolean, False),
    )


def _either(flat: Section, plugin: Section, key: str, check: Check[T], default: T) -> T:
    """A setting that may be given as flags.<key>, flags.plugin.<key> or both, if they agree."""
    given = [s.value(key, check, None) for s in (flat, plugin)]
    if given[0] is not None and given[1] is not None and given[0] != given[1]:
        same = f"the same value as {flat.at(key)} ({shown(flat.raw(key))})"
        raise SchemaError(f"{same}, got {shown(plugin.raw(key))}", plugin.at(key))
    return next((v for v in given if v is not None), default)


_REPLICATED_KEYS = ("renameByDefault", "failRequestsGreaterThanOne", "resources")


def _shared(sec: Section) -> TimeSlicing:
    mps = _replicated(sec.section("mps", _REPLICATED_KEYS))
    if mps.resources:
        raise SchemaError(
            "not supported: MPS sharing (use sharing.timeSlicing)", sec.at("mps.resources")
        )
    if sec.has("mps"):
        sec.ignored.append(sec.at("mps"))
    return _replicated(sec.section("timeSlicing", _REPLICATED_KEYS))


def _replicated(sec: Section) -> TimeSlicing:
    sharing = TimeSlicing(
        rename_by_default=sec.value("renameByDefault", boolean, False),
        fail_requests_greater_than_one=sec.value("failRequestsGreaterThanOne", boolean, False),
    )
    names: dict[str, str] = {}
    advertised: dict[str, str] = {}
    for path, raw in sec.each("resources"):
        item = Section(raw, path, ("name", "replicas", "rename", "devices"), sec.ignored)
        entry = TimeSlicedResource(
            name=item.required("name", gpu_resource, "a GPU resource name such as nvidia.com/gpu"),
            replicas=item.required("replicas", integer(1), "an integer >= 1"),
            rename=item.value("rename", shared_name, None),
            devices=item.value("devices", devices, "all"),
        )
        _once(names, entry.name, item.at("name"))
        sharing = TimeSlicing(
            sharing.rename_by_default,
            sharing.fail_requests_greater_than_one,
            (*sharing.resources, entry),
        )
        where = item.at("rename") if entry.rename else item.path
        _once(advertised, sharing.advertised_name(entry.name), where)
    return sharing


def _once(seen: dict[str, str], name: str, path: str) -> None:
    """Record that `name` is used at `path`; a second use is an error."""
    if name in seen:
        raise SchemaError(
            f"a resource name not used before, got {shown(name)} (also at {seen[name]})", path
        )
    seen[name] = path


def _refuse_pattern_renames(sec: Section) -> None:
    for key in ("gpus", "mig"):
        for path, raw in sec.each(key):
            item = Section(raw, path, ("pattern", "name"), sec.ignored)
            item.required("pattern", text, "a device name pattern")
            item.required("name", shared_name, EXTENDED_NAME)
            raise SchemaError(
                "not supported: renaming resources by pattern (remove resources)", path
            )


def _refuse_imex_channels(sec: Section) -> None:
    channels = sec.value("channelIDs", list_of(integer(0)), tuple[int, ...]())
    sec.value("required", boolean, False)
    if channels:
        raise SchemaError(
            "not supported: IMEX channels (remove imex.channelIDs)", sec.at("channelIDs")
        )


def _roce(sec: Section) -> Roce:
    sel = sec.section(
        "selectors", ("vendors", "ifNames", "linkLayers", "pciAddresses", "rdmaDevices")
    )
    selectors = RoceSelectors(
        vendors=sel.value("vendors", list_of(vendor, nonempty=True), ("15b3",)),
        if_names=sel.value("ifNames", list_of(text), ()),
        link_layers=sel.value("linkLayers", list_of(link_layer, nonempty=True), ("Ethernet",)),
        pci_addresses=sel.value("pciAddresses", list_of(pci_address), ()),
        rdma_devices=sel.value("rdmaDevices", list_of(text), ()),
    )
    return Roce(sec.value("resourceName", extended_name, "rdma/roce"), selectors)
