"""The agent's configuration file (docs/configuration.md), parsed strictly into frozen dataclasses.

Files of the established v1 config format are accepted unchanged: each of its keys is
honoured, listed as ignored (to be logged once), or refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from agents.config_shares import KEYS as SHARES_KEYS
from agents.config_shares import Shares, parse_shares
from agents.configschema import (
    EXTENDED_NAME,
    Check,
    ReplicatedDevices,
    SchemaError,
    Section,
    annotation_prefix,
    bad,
    boolean,
    devices,
    duration,
    extended_name,
    gpu_resource,
    host_root,
    integer,
    label_value,
    link_layer,
    list_of,
    load_yaml,
    mapping_of,
    one_of,
    pci_address,
    shared_name,
    shown,
    string,
    text,
    vendor,
)
from agents.core.degraded import Limits
from agents.core.fabric_place import LABEL_KEY_SETS
from agents.errors import ConfigError

T = TypeVar("T")
MigStrategy = Literal["none", "single", "mixed"]
DeviceIDStrategy = Literal["uuid", "index"]
SharedDevicesPolicy = Literal["distributed", "packed"]

MIG_STRATEGIES: tuple[MigStrategy, ...] = ("none", "single", "mixed")
DEVICE_ID_STRATEGIES: tuple[DeviceIDStrategy, ...] = ("uuid", "index")
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
SHARED_DEVICES_POLICIES: tuple[SharedDevicesPolicy, ...] = ("distributed", "packed")
DEVICE_DISCOVERY_STRATEGIES = ("auto", "nvml", "tegra")
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
CONTAINER_DRIVER_ROOT = "/driver-root"  # where NVIDIA's plugin has the driver's root mounted
IMEX_CHANNEL_SETS = ((), (0,))  # the channelIDs NVIDIA's plugin v0.20 allows
SHARED_SUFFIX = ".shared"
# Bounds on time-slicing (docs/configuration.md#time-slicing-bounds): every replica is a
# device in the agent's memory and in the ListAndWatch message the kubelet must take.
MAX_REPLICAS = 1024  # per GPU or MIG instance, in one sharing.timeSlicing entry
MAX_SHARED_DEVICES = 16384  # replicas a node advertises, all resources together
MAX_MPS_REPLICAS = 48  # clients one MPS server takes on Volta and later (NVIDIA's bound)


@dataclass(frozen=True)
class Flags:
    mig_strategy: MigStrategy = "none"
    fail_on_init_error: bool = True
    device_id_strategy: DeviceIDStrategy = "uuid"
    device_list_strategy: frozenset[str] = frozenset({"envvar"})
    pass_device_specs: bool = False
    gds_enabled: bool = False
    mofed_enabled: bool = False
    gdrcopy_enabled: bool = False
    nvidia_driver_root: str = "/"
    nvidia_dev_root: str | None = None  # None: the driver root
    container_driver_root: str = CONTAINER_DRIVER_ROOT  # where IMEX channels are looked for
    cdi_annotation_prefix: str = CDI_ANNOTATION_PREFIX
    shared_devices_allocation_policy: SharedDevicesPolicy = "distributed"
    mps_root: str | None = None  # flags.mpsRoot: where MPS pipes, logs and shm live

    @property
    def host_dev_root(self) -> str:
        """Where the host has the device nodes that passDeviceSpecs names."""
        return self.nvidia_dev_root or self.nvidia_driver_root

    @property
    def only_cdi(self) -> bool:
        """Whether every device-list strategy is a CDI one: the runtime then injects
        everything, and no env, mount or device spec names the devices."""
        return all(s.startswith("cdi-") for s in self.device_list_strategy)


@dataclass(frozen=True)
class TimeSlicedResource:
    name: str
    replicas: int
    rename: str | None = None


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
    """`sharing`: replicas time-sliced, or served through MPS (`mps` given wins, as in
    NVIDIA's plugin, whose MPS only runs where some resource has more than one replica)."""

    time_slicing: TimeSlicing = field(default_factory=TimeSlicing)
    mps: TimeSlicing | None = None
    shares: Shares | None = None  # DRA only: whole GPUs shared by claims' capacity

    @property
    def served_shares(self) -> Shares | None:
        """The shares, where claims consume them (DRA); None elsewhere."""
        return self.shares if self.shares is not None and self.shares.by_claims else None

    @property
    def replicated(self) -> TimeSlicing:
        """The replicas served, whichever way they are shared."""
        return self.time_slicing if self.mps is None else self.mps

    @property
    def mps_active(self) -> bool:
        """Whether replicas are served through MPS control daemons."""
        return self.mps is not None and any(r.replicas > 1 for r in self.mps.resources)

    @property
    def key(self) -> str:
        """The config key of the replicas served, as errors name it."""
        return "sharing.timeSlicing" if self.mps is None else "sharing.mps"


@dataclass(frozen=True)
class RoceSelectors:
    """Which NIC functions are the RoCE family; an empty tuple matches any, but for
    `link_layers`: a function needs a port of one of them (only Ethernet is RoCE)."""

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


DegradedReport = Literal["healthy", "unhealthy"]
DEGRADED_REPORTS: tuple[DegradedReport, ...] = ("healthy", "unhealthy")


@dataclass(frozen=True)
class Degraded:
    """`health.degraded` (docs/degraded.md): what the kubelet is told of a Degraded
    device, and the signals' thresholds."""

    report: DegradedReport = "healthy"
    hold_s: int = 60
    nic_speed_mbps: int = 0  # 0: the highest speed among the node's NICs of the same model
    rdma_errors_per_minute: int = 10

    @property
    def limits(self) -> Limits:
        return Limits(float(self.hold_s), self.nic_speed_mbps, self.rdma_errors_per_minute)


@dataclass(frozen=True)
class Health:
    disabled_xids: frozenset[int] = frozenset()
    xid_recovery_s: int | None = None  # None: a critical XID holds until reset or restart
    degraded: Degraded = field(default_factory=Degraded)


@dataclass(frozen=True)
class Fabric:
    """What the node labels say of the fabric (docs/fabric.md)."""

    spines: tuple[tuple[str, str], ...] = ()  # (leaf name, spine name), sorted by leaf
    label_keys: tuple[str, ...] = ("node-agents",)  # key sets: node-agents, topograph

    @property
    def spine_map(self) -> dict[str, str]:
        return dict(self.spines)


@dataclass(frozen=True)
class Imex:
    """`imex` (docs/configuration.md#imex-channels): the IMEX channels every GPU
    container gets, in device-plugin mode; `required`: a missing channel stops the agent
    instead of a warning."""

    channel_ids: tuple[int, ...] = ()
    required: bool = False


@dataclass(frozen=True)
class Config:
    version: str = "v1"
    flags: Flags = field(default_factory=Flags)
    sharing: Sharing = field(default_factory=Sharing)
    roce: Roce = field(default_factory=Roce)
    pairing: Pairing = field(default_factory=Pairing)
    health: Health = field(default_factory=Health)
    fabric: Fabric = field(default_factory=Fabric)
    imex: Imex = field(default_factory=Imex)
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
    version = top.value("version", _version, "v1")
    flags = _flags(top.section("flags", _FLAG_KEYS))
    sharing = _shared(top.section("sharing", ("timeSlicing", "mps", "shares")))
    flags = _mps_flags(top.section("flags", _FLAG_KEYS), flags, sharing)
    sharing = _shares_root(top.section("flags", _FLAG_KEYS), sharing)
    _ignore_pattern_renames(top.section("resources", ("gpus", "mig")))
    imex = _imex(top.section("imex", ("channelIDs", "required")))
    roce = _roce(top.section("roce", ("resourceName", "selectors")))
    pairing = Pairing(top.section("pairing", ("enabled",)).value("enabled", boolean, True))
    health = top.section("health", ("disabledXids", "xidRecovery", "degraded"))
    xids = health.value("disabledXids", list_of(integer(1)), tuple[int, ...]())
    recovery = health.value("xidRecovery", integer(0), 0)  # seconds; 0: never
    degraded = _degraded(health.section("degraded", _DEGRADED_KEYS))
    health_ = Health(frozenset(xids), recovery or None, degraded)
    fabric = _fabric(top.section("fabric", ("spines", "labelKeys")))
    if imex.channel_ids and _DRIVER_ROOT_KEY in top.ignored:
        top.ignored.remove(_DRIVER_ROOT_KEY)  # where the channels are looked for
    return Config(
        version,
        flags,
        sharing,
        roce,
        pairing,
        health_,
        fabric,
        imex,
        ignored_keys=tuple(top.ignored),
    )


def _version(value: object) -> str:
    """v1; an empty version means v1 too, as in the v1 format."""
    return "v1" if value == "" else one_of(("v1",))(value)


_TOP_KEYS = (
    *("version", "flags", "sharing", "roce", "pairing", "health", "fabric"),
    *("resources", "imex"),
)
_PLUGIN_KEYS = (
    *("passDeviceSpecs", "deviceListStrategy", "deviceIDStrategy"),
    *("cdiAnnotationPrefix", "sharedDevicesAllocationPolicy"),
)
# For writing CDI specs, which is not done here; the driver root also says where IMEX
# channels are looked for, so it is listed as ignored only without channels.
_CDI_SPEC_KEYS = ("nvidiaCTKPath", "containerDriverRoot")
_DRIVER_ROOT_KEY = "flags.plugin.containerDriverRoot"
_ROOT_KEYS = ("nvidiaDriverRoot", "nvidiaDevRoot")
_DRIVER_ENV_KEYS = ("gdsEnabled", "mofedEnabled", "gdrcopyEnabled")
_INERT_FLAGS: dict[str, Check[object]] = {
    "useNodeFeatureAPI": boolean,
    "deviceDiscoveryStrategy": one_of(DEVICE_DISCOVERY_STRATEGIES),
}
_FLAG_KEYS = (
    *("migStrategy", "failOnInitError", "plugin", "gfd"),
    *(_PLUGIN_KEYS + _ROOT_KEYS + _DRIVER_ENV_KEYS + tuple(_INERT_FLAGS)),
    "mpsRoot",
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
    plugin = sec.section("plugin", _PLUGIN_KEYS + _CDI_SPEC_KEYS)
    plugin.ignore("nvidiaCTKPath", string)
    driver_root = plugin.value("containerDriverRoot", host_root, "") or CONTAINER_DRIVER_ROOT
    plugin.ignore("containerDriverRoot", host_root)
    for key, check in _INERT_FLAGS.items():
        sec.ignore(key, check)
    gfd = sec.section("gfd", tuple(_GFD_KEYS))
    for key, check in _GFD_KEYS.items():
        gfd.ignore(key, check)
    flags = Flags(
        mig_strategy=sec.value("migStrategy", one_of(MIG_STRATEGIES), "none"),
        fail_on_init_error=sec.value("failOnInitError", boolean, True),
        device_id_strategy=_either(
            sec, plugin, "deviceIDStrategy", one_of(DEVICE_ID_STRATEGIES), "uuid"
        ),
        device_list_strategy=_either(
            sec, plugin, "deviceListStrategy", _device_lists, frozenset({"envvar"})
        ),
        pass_device_specs=_either(sec, plugin, "passDeviceSpecs", boolean, False),
        gds_enabled=sec.value("gdsEnabled", boolean, False),
        mofed_enabled=sec.value("mofedEnabled", boolean, False),
        gdrcopy_enabled=sec.value("gdrcopyEnabled", boolean, False),
        nvidia_driver_root=sec.value("nvidiaDriverRoot", host_root, "") or "/",
        nvidia_dev_root=sec.value("nvidiaDevRoot", host_root, "") or None,
        container_driver_root=driver_root,
        cdi_annotation_prefix=_either(
            sec, plugin, "cdiAnnotationPrefix", annotation_prefix, CDI_ANNOTATION_PREFIX
        ),
        shared_devices_allocation_policy=_either(
            sec,
            plugin,
            "sharedDevicesAllocationPolicy",
            one_of(SHARED_DEVICES_POLICIES),
            "distributed",
        ),
    )
    _list_unused(sec, plugin, flags)
    return flags


def _list_unused(flat: Section, plugin: Section, flags: Flags) -> None:
    """List as ignored the keys that only matter with a setting this file does not make."""
    unused = list[tuple[Section, str]]()
    if not flags.pass_device_specs or flags.only_cdi:
        unused += [(flat, key) for key in _ROOT_KEYS]
    elif flags.nvidia_dev_root is not None:
        unused.append((flat, "nvidiaDriverRoot"))  # the device nodes' root overrides it
    if "cdi-annotations" not in flags.device_list_strategy:
        unused += [(s, "cdiAnnotationPrefix") for s in (flat, plugin)]
    flat.ignored.extend(s.at(key) for s, key in unused if s.has(key))


def _either(flat: Section, plugin: Section, key: str, check: Check[T], default: T) -> T:
    """A setting that may be given as flags.<key>, flags.plugin.<key> or both, if they agree."""
    given = [s.value(key, check, None) for s in (flat, plugin)]
    if given[0] is not None and given[1] is not None and given[0] != given[1]:
        same = f"the same value as {flat.at(key)} ({shown(flat.raw(key))})"
        raise SchemaError(f"{same}, got {shown(plugin.raw(key))}", plugin.at(key))
    return next((v for v in given if v is not None), default)


_REPLICATED_KEYS = ("renameByDefault", "failRequestsGreaterThanOne", "resources")


def _shared(sec: Section) -> Sharing:
    """Time-slicing, or MPS: with both, MPS wins and timeSlicing is listed as ignored;
    and shares, which DRA alone reads."""
    slicing = _replicated(sec.section("timeSlicing", _REPLICATED_KEYS), False, MAX_REPLICAS)
    shares = parse_shares(sec.section("shares", SHARES_KEYS)) if sec.has("shares") else None
    if not sec.has("mps"):
        return Sharing(slicing, shares=shares)
    mps = _replicated(sec.section("mps", _REPLICATED_KEYS), True, MAX_MPS_REPLICAS)
    if not mps.resources:  # NVIDIA's plugin: "no resources specified"
        raise SchemaError("at least one resource to share", sec.at("mps") + ".resources")
    if sec.has("timeSlicing"):
        sec.ignored.append(sec.at("timeSlicing"))
    return Sharing(TimeSlicing(), mps, shares)


def _shares_root(flags: Section, sharing: Sharing) -> Sharing:
    """Shares' MPS pipes and shared memory under flags.mpsRoot, where it is given."""
    root = flags.value("mpsRoot", host_root, "")
    if sharing.shares is None or not root:
        return sharing
    return dataclasses.replace(sharing, shares=dataclasses.replace(sharing.shares, mps_root=root))


def _mps_flags(sec: Section, flags: Flags, sharing: Sharing) -> Flags:
    """flags.mpsRoot, honoured where MPS runs and refused where NVIDIA's plugin v0.20
    refuses to start: MPS without a root, or with migStrategy mixed."""
    root = sec.value("mpsRoot", host_root, "")
    if not sharing.mps_active:
        if sharing.shares is None:
            sec.ignore("mpsRoot", string)
        return flags
    if flags.mig_strategy == "mixed":
        raise SchemaError(
            "none or single with sharing.mps (MPS is not served with mixed)",
            sec.at("migStrategy"),
        )
    if not root:
        raise SchemaError(
            "a host directory for MPS pipes and logs (e.g. /run/nvidia/mps): sharing.mps needs it",
            sec.at("mpsRoot"),
        )
    return dataclasses.replace(flags, mps_root=root)


def _replicated(sec: Section, fail_by_default: bool, most: int) -> TimeSlicing:
    """One way of sharing; MPS fails requests for more than one replica by default."""
    sharing = TimeSlicing(
        rename_by_default=sec.value("renameByDefault", boolean, False),
        fail_requests_greater_than_one=sec.value(
            "failRequestsGreaterThanOne", boolean, fail_by_default
        ),
    )
    names: dict[str, str] = {}
    advertised: dict[str, str] = {}
    for path, raw in sec.each("resources"):
        item = Section(raw, path, ("name", "replicas", "rename", "devices"), sec.ignored)
        entry = TimeSlicedResource(
            name=item.required("name", gpu_resource, "a GPU resource name such as nvidia.com/gpu"),
            replicas=item.required("replicas", _replicas(most), "an integer >= 1"),
            rename=item.value("rename", shared_name, None),
        )
        chosen: ReplicatedDevices = item.value("devices", devices, "all")
        if chosen != "all":
            item.ignored.append(item.at("devices"))  # every GPU is shared, as the v1 format does
        _once(names, entry.name, item.at("name"))
        sharing = TimeSlicing(
            sharing.rename_by_default,
            sharing.fail_requests_greater_than_one,
            (*sharing.resources, entry),
        )
        where = item.at("rename") if entry.rename else item.path
        _once(advertised, sharing.advertised_name(entry.name), where)
    return sharing


def _replicas(most: int) -> Check[int]:
    def check(value: object) -> int:
        count = integer(1)(value)
        if count > most:
            raise bad(f"at most {most} (replicas per GPU or MIG instance)", value)
        return count

    return check


def _once(seen: dict[str, str], name: str, path: str) -> None:
    """Record that `name` is used at `path`; a second use is an error."""
    if name in seen:
        raise SchemaError(
            f"a resource name not used before, got {shown(name)} (also at {seen[name]})", path
        )
    seen[name] = path


def _ignore_pattern_renames(sec: Section) -> None:
    """Renames by product pattern are read and checked, then ignored, as the v1 format's
    own plugin does; a non-empty list is named in the ignored keys."""
    for key in ("gpus", "mig"):
        for path, raw in sec.each(key):
            item = Section(raw, path, ("pattern", "name"), sec.ignored)
            item.required("pattern", text, "a device name pattern")
            item.required("name", shared_name, EXTENDED_NAME)
        if sec.raw(key):
            sec.ignored.append(sec.at(key))


def _imex(sec: Section) -> Imex:
    """The channels as NVIDIA's plugin v0.20 allows them; without any, both keys are
    listed as ignored (`required` then asks for nothing)."""
    channels = sec.value("channelIDs", list_of(integer(0)), tuple[int, ...]())
    if channels not in IMEX_CHANNEL_SETS:
        raise SchemaError(
            f"[] or [0], the IMEX channels NVIDIA's plugin allows, got {list(channels)}",
            sec.at("channelIDs"),
        )
    if not channels:
        sec.ignore("channelIDs", list_of(integer(0)))
        sec.ignore("required", boolean)
        return Imex()
    return Imex(channels, sec.value("required", boolean, False))


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


_DEGRADED_KEYS = ("report", "holdS", "nicSpeedMbps", "rdmaErrorsPerMinute")
MAX_HOLD_S = 86400  # a day: a longer hold would keep a recovered device out of use for days


def _degraded(sec: Section) -> Degraded:
    default = Degraded()
    return Degraded(
        report=sec.value("report", one_of(DEGRADED_REPORTS), default.report),
        hold_s=sec.value("holdS", _hold_s, default.hold_s),
        nic_speed_mbps=sec.value("nicSpeedMbps", integer(0), default.nic_speed_mbps),
        rdma_errors_per_minute=sec.value(
            "rdmaErrorsPerMinute", integer(0), default.rdma_errors_per_minute
        ),
    )


def _hold_s(value: object) -> int:
    seconds = integer(0)(value)
    if seconds > MAX_HOLD_S:
        raise bad(f"at most {MAX_HOLD_S} (seconds)", value)
    return seconds


def _fabric(sec: Section) -> Fabric:
    spines = sec.value("spines", mapping_of(text, label_value), dict[str, str]())
    keys = sec.value("labelKeys", list_of(one_of(LABEL_KEY_SETS)), Fabric().label_keys)
    return Fabric(tuple(sorted(spines.items())), tuple(dict.fromkeys(keys)))
