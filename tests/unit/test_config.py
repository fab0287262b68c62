"""The config file: the documented values, established v1 format compatibility, strict errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.config import (
    MAX_REPLICAS,
    Config,
    Fabric,
    Flags,
    Health,
    Imex,
    Pairing,
    Roce,
    RoceSelectors,
    Sharing,
    TimeSlicedResource,
    TimeSlicing,
    load_config,
    parse_config,
)
from agents.errors import ConfigError

SPEC_EXAMPLE = """\
version: v1
flags:
  migStrategy: none            # none | single | mixed
  failOnInitError: true        # false: no NVML -> serve no GPU resources, keep running
  deviceIDStrategy: uuid       # uuid | index
  deviceListStrategy: [envvar] # any of: envvar, cdi-cri (CDI names in Allocate)
  passDeviceSpecs: false       # true: also return /dev/nvidia* device specs
sharing:
  timeSlicing:
    renameByDefault: false     # true: resource becomes <name>.shared
    failRequestsGreaterThanOne: false
    resources:
      - name: nvidia.com/gpu
        replicas: 4
roce:
  resourceName: rdma/roce
  selectors: {vendors: ["15b3"], ifNames: [], linkLayers: [Ethernet]}
pairing:
  enabled: true
health:
  disabledXids: []             # added to the built-in list of application XIDs
"""

ESTABLISHED_TIME_SLICING = """\
version: v1
flags:
  migStrategy: mixed
  failOnInitError: true
  nvidiaDriverRoot: /run/nvidia/driver
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: envvar
    deviceIDStrategy: index
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""

TS = "sharing: {timeSlicing: %s}\n"

ESTABLISHED_EVERY_KEY = """\
version: v1
flags:
  migStrategy: single
  failOnInitError: false
  mpsRoot: /run/nvidia/mps
  nvidiaDriverRoot: /run/nvidia/driver
  nvidiaDevRoot: /
  gdrcopyEnabled: true
  gdsEnabled: true
  mofedEnabled: false
  useNodeFeatureAPI: false
  deviceDiscoveryStrategy: auto
  plugin:
    passDeviceSpecs: true
    deviceListStrategy: [envvar, volume-mounts, cdi-annotations, cdi-cri]
    deviceIDStrategy: index
    cdiAnnotationPrefix: cdi.example.com/
    nvidiaCTKPath: /usr/bin/nvidia-ctk
    containerDriverRoot: /driver-root
    sharedDevicesAllocationPolicy: packed
  gfd:
    oneshot: false
    noTimestamp: false
    sleepInterval: infinite
    outputFile: /etc/kubernetes/node-feature-discovery/features.d/gfd
    machineTypeFile: /sys/class/dmi/id/product_name
resources:
  gpus: [{pattern: '*A100*', name: a100}]
  mig: [{pattern: '1g.10gb', name: mig-small}]
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: true
    resources:
    - {name: nvidia.com/gpu, rename: gpu-ts, replicas: 2, devices: [0, 'GPU-3b1f']}
imex:
  channelIDs: []
  required: false
"""


def test_spec_example_parses_to_the_documented_values() -> None:
    expected = Config(
        flags=Flags(),
        sharing=Sharing(TimeSlicing(resources=(TimeSlicedResource("nvidia.com/gpu", 4),))),
        roce=Roce("rdma/roce", RoceSelectors(vendors=("15b3",), link_layers=("Ethernet",))),
        pairing=Pairing(enabled=True),
        health=Health(frozenset()),
    )
    assert parse_config(SPEC_EXAMPLE, "c.yaml") == expected


@pytest.mark.parametrize(
    "text",
    ["", "# only a comment\n", "---\n", "{}\n", "version: ''\n", "version: v1\n"],
    ids=["empty", "comment", "marker", "map", "empty-version", "version-only"],
)
def test_empty_document_gives_the_defaults(text: str) -> None:
    assert parse_config(text, "c.yaml") == Config.default()


def test_established_time_slicing_config_is_accepted_unchanged() -> None:
    config = parse_config(ESTABLISHED_TIME_SLICING, "c.yaml")
    assert config.flags == Flags(
        mig_strategy="mixed",
        device_id_strategy="index",
        device_list_strategy=frozenset({"envvar"}),
        pass_device_specs=True,
        nvidia_driver_root="/run/nvidia/driver",
    )
    assert config.flags.host_dev_root == "/run/nvidia/driver"
    ts = config.sharing.time_slicing
    assert ts.rename_by_default and ts.fail_requests_greater_than_one
    assert ts.replicas_for("nvidia.com/gpu") == TimeSlicedResource("nvidia.com/gpu", 4)
    assert ts.advertised_name("nvidia.com/gpu") == "nvidia.com/gpu.shared"
    assert config.ignored_keys == ()


def test_every_established_key_is_read_and_inert_ones_are_listed() -> None:
    config = parse_config(ESTABLISHED_EVERY_KEY, "c.yaml")
    assert config.flags == Flags(
        mig_strategy="single",
        fail_on_init_error=False,
        device_id_strategy="index",
        device_list_strategy=frozenset({"envvar", "volume-mounts", "cdi-annotations", "cdi-cri"}),
        pass_device_specs=True,
        gds_enabled=True,
        gdrcopy_enabled=True,
        nvidia_driver_root="/run/nvidia/driver",
        nvidia_dev_root="/",
        cdi_annotation_prefix="cdi.example.com/",
        shared_devices_allocation_policy="packed",
    )
    assert config.flags.host_dev_root == "/"
    ts = config.sharing.time_slicing
    assert ts.resources == (TimeSlicedResource("nvidia.com/gpu", 2, "nvidia.com/gpu-ts"),)
    assert set(config.ignored_keys) == {
        *(f"flags.plugin.{k}" for k in ("nvidiaCTKPath", "containerDriverRoot")),
        *(f"flags.{k}" for k in ("mpsRoot", "useNodeFeatureAPI", "deviceDiscoveryStrategy")),
        "flags.nvidiaDriverRoot",  # nvidiaDevRoot is given: the device nodes are there
        *(f"flags.gfd.{k}" for k in ("oneshot", "noTimestamp", "sleepInterval")),
        *(f"flags.gfd.{k}" for k in ("outputFile", "machineTypeFile")),
        "resources.gpus",
        "resources.mig",
        "sharing.timeSlicing.resources[0].devices",
        "imex.channelIDs",
        "imex.required",
    }
    assert len(config.ignored_keys) == len(set(config.ignored_keys))


@pytest.mark.parametrize(
    ("text", "ignored"),
    [
        ("flags: {nvidiaDriverRoot: /run/nvidia/driver}", ["flags.nvidiaDriverRoot"]),
        (
            "flags: {nvidiaDevRoot: /, plugin: {passDeviceSpecs: true,"
            " deviceListStrategy: cdi-cri}}",
            ["flags.nvidiaDevRoot"],
        ),
        ("flags: {nvidiaDriverRoot: /run/nvidia/driver, passDeviceSpecs: true}", []),
        (
            "flags: {nvidiaDriverRoot: /a, nvidiaDevRoot: /b, passDeviceSpecs: true}",
            ["flags.nvidiaDriverRoot"],
        ),
        ("flags: {plugin: {cdiAnnotationPrefix: a.b/}}", ["flags.plugin.cdiAnnotationPrefix"]),
        (
            "flags: {plugin: {cdiAnnotationPrefix: a.b/, deviceListStrategy: cdi-annotations}}",
            [],
        ),
        (TS % "{resources: [{name: gpu, replicas: 2, devices: all}]}", []),
        (
            TS % "{resources: [{name: gpu, replicas: 2, devices: 3}]}",
            ["sharing.timeSlicing.resources[0].devices"],
        ),
        (
            TS % "{resources: [{name: gpu, replicas: 2, devices: ['MIG-GPU-3b1f/1/0', '0:1']}]}",
            ["sharing.timeSlicing.resources[0].devices"],
        ),
        ("resources: {gpus: []}", []),
        ("resources: {mig: [{pattern: '*', name: mig}]}", ["resources.mig"]),
        ("imex: {required: true}", ["imex.required"]),
        ("flags: {gfd: {sleepInterval: 1h30m}}", ["flags.gfd.sleepInterval"]),
        ("flags: {gfd: {sleepInterval: 60000000000}}", ["flags.gfd.sleepInterval"]),
    ],
    ids=[
        "driver-root-without-device-specs",
        "dev-root-with-cdi-only",
        "driver-root-with-device-specs",
        "driver-root-under-a-dev-root",
        "annotation-prefix-without-cdi-annotations",
        "annotation-prefix-with-cdi-annotations",
        "devices-all",
        "devices-count",
        "devices-mig-refs",
        "empty-pattern-list",
        "pattern-renames",
        "imex-without-channels",
        "gfd-duration",
        "gfd-nanoseconds",
    ],
)
def test_keys_without_effect_are_listed_once(text: str, ignored: list[str]) -> None:
    assert list(parse_config(text + "\n", "c.yaml").ignored_keys) == ignored


@pytest.mark.parametrize(
    ("text", "imex", "ignored"),
    [
        ("imex: {channelIDs: []}", Imex(), ["imex.channelIDs"]),
        ("imex: {channelIDs: [0]}", Imex((0,)), []),
        ("imex: {channelIDs: [0], required: true}", Imex((0,), required=True), []),
        (
            "imex: {channelIDs: [], required: true}\n"
            "flags: {plugin: {containerDriverRoot: /run/nvidia/driver}}",
            Imex(),
            ["flags.plugin.containerDriverRoot", "imex.channelIDs", "imex.required"],
        ),
        (
            "imex: {channelIDs: [0]}\nflags: {plugin: {containerDriverRoot: /run/nvidia/driver}}",
            Imex((0,)),
            [],
        ),
    ],
    ids=["none", "channel-0", "channel-0-required", "no-channel-no-root", "root-for-the-channel"],
)
def test_imex_channels_are_honoured_as_nvidia_allows_them(
    text: str, imex: Imex, ignored: list[str]
) -> None:
    config = parse_config(text + "\n", "c.yaml")
    assert config.imex == imex
    assert list(config.ignored_keys) == ignored


def test_the_container_driver_root_says_where_imex_channels_are_looked_for() -> None:
    assert Flags().container_driver_root == "/driver-root"
    text = "flags: {plugin: {containerDriverRoot: /run/nvidia/driver}}\n"
    assert parse_config(text, "c.yaml").flags.container_driver_root == "/run/nvidia/driver"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("{plugin: {passDeviceSpecs: true}}", Flags(pass_device_specs=True)),
        ("{passDeviceSpecs: true}", Flags(pass_device_specs=True)),
        ("{passDeviceSpecs: true, plugin: {passDeviceSpecs: true}}", Flags(pass_device_specs=True)),
        ("{deviceListStrategy: cdi-cri}", Flags(device_list_strategy=frozenset({"cdi-cri"}))),
        (
            "{deviceListStrategy: [cdi-cri, envvar],"
            " plugin: {deviceListStrategy: [envvar, cdi-cri]}}",
            Flags(device_list_strategy=frozenset({"envvar", "cdi-cri"})),
        ),
        ("{plugin: {deviceIDStrategy: index}}", Flags(device_id_strategy="index")),
        ("{failOnInitError: false}", Flags(fail_on_init_error=False)),
        ("{migStrategy: mixed, plugin: null}", Flags(mig_strategy="mixed")),
        (
            "{plugin: {deviceListStrategy: volume-mounts}}",
            Flags(device_list_strategy=frozenset({"volume-mounts"})),
        ),
        (
            "{plugin: {deviceListStrategy: [cdi-annotations, cdi-cri]}}",
            Flags(device_list_strategy=frozenset({"cdi-annotations", "cdi-cri"})),
        ),
        (
            "{gdsEnabled: true, mofedEnabled: true, gdrcopyEnabled: true}",
            Flags(gds_enabled=True, mofed_enabled=True, gdrcopy_enabled=True),
        ),
        (
            "{plugin: {sharedDevicesAllocationPolicy: packed}}",
            Flags(shared_devices_allocation_policy="packed"),
        ),
        ("{nvidiaDriverRoot: '', nvidiaDevRoot: ''}", Flags()),
    ],
    ids=[
        "plugin-only",
        "flat-only",
        "both-agree",
        "list-strategy-as-string",
        "list-strategy-same-set",
        "plugin-id-strategy",
        "fail-on-init",
        "null-section",
        "volume-mounts",
        "both-cdi",
        "driver-features",
        "packed",
        "empty-roots",
    ],
)
def test_plugin_and_flat_flags_are_the_same_settings(flags: str, expected: Flags) -> None:
    assert parse_config(f"flags: {flags}\n", "c.yaml").flags == expected


@pytest.mark.parametrize(
    ("time_slicing", "resource", "advertised"),
    [
        ("{resources: [{name: nvidia.com/gpu, replicas: 2}]}", "nvidia.com/gpu", "nvidia.com/gpu"),
        (
            "{renameByDefault: true, resources: [{name: nvidia.com/mig-1g.10gb, replicas: 2}]}",
            "nvidia.com/mig-1g.10gb",
            "nvidia.com/mig-1g.10gb.shared",
        ),
        (
            "{resources: [{name: gpu, rename: gpu-shared, replicas: 3, devices: 2}]}",
            "nvidia.com/gpu",
            "nvidia.com/gpu-shared",
        ),
    ],
    ids=["plain", "rename-by-default", "bare-names"],
)
def test_time_sliced_resources_resolve_their_advertised_name(
    time_slicing: str, resource: str, advertised: str
) -> None:
    ts = parse_config(TS % time_slicing, "c.yaml").sharing.time_slicing
    assert ts.replicas_for(resource) is not None
    assert ts.advertised_name(resource) == advertised
    assert ts.replicas_for("nvidia.com/mig-7g.80gb") is None
    assert ts.advertised_name("nvidia.com/mig-7g.80gb") == "nvidia.com/mig-7g.80gb"


def test_replicas_up_to_the_documented_bound_are_accepted() -> None:
    text = TS % f"{{resources: [{{name: nvidia.com/gpu, replicas: {MAX_REPLICAS}}}]}}"
    (entry,) = parse_config(text, "c.yaml").sharing.time_slicing.resources
    assert entry.replicas == MAX_REPLICAS == 1024
    reference = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    assert f"at most {MAX_REPLICAS}" in reference


MPS = """\
flags: {mpsRoot: /run/nvidia/mps}
sharing:
  mps:
    renameByDefault: true
    resources: [{name: nvidia.com/gpu, replicas: 4}]
"""


def test_mps_sharing_is_honoured_with_its_root_and_fails_requests_over_one() -> None:
    config = parse_config(MPS, "c.yaml")
    assert config.sharing.mps_active
    assert config.flags.mps_root == "/run/nvidia/mps"
    mps = config.sharing.replicated
    assert mps.fail_requests_greater_than_one  # MPS's default, unlike time-slicing's
    assert mps.advertised_name("nvidia.com/gpu") == "nvidia.com/gpu.shared"
    assert config.sharing.key == "sharing.mps"
    assert config.ignored_keys == ()


def test_mps_wins_over_time_slicing_which_is_listed_as_ignored() -> None:
    text = MPS + "  timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n"
    config = parse_config(text, "c.yaml")
    assert config.sharing.replicated.resources[0].replicas == 4
    assert config.sharing.time_slicing.resources == ()
    assert config.ignored_keys == ("sharing.timeSlicing",)


def test_mps_with_one_replica_runs_no_daemon_and_needs_no_root() -> None:
    text = "sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 1}]}}\n"
    config = parse_config(text, "c.yaml")
    assert not config.sharing.mps_active
    assert config.flags.mps_root is None
    assert config.sharing.replicated.fail_requests_greater_than_one


def test_mps_may_fail_requests_over_one_no_longer() -> None:
    text = MPS.replace("renameByDefault: true", "failRequestsGreaterThanOne: false")
    assert not parse_config(text, "c.yaml").sharing.replicated.fail_requests_greater_than_one


def test_roce_pairing_and_health_settings_are_read() -> None:
    config = parse_config(
        "roce:\n  resourceName: example.com/roce\n  selectors:\n"
        "    vendors: ['15B3', '8086']\n    ifNames: [ens1np0]\n"
        "    pciAddresses: ['0000:1C:00.0']\n"
        "    rdmaDevices: [mlx5_0]\npairing: {enabled: false}\nhealth: {disabledXids: [13, 31]}\n",
        "c.yaml",
    )
    assert config.roce == Roce(
        "example.com/roce",
        RoceSelectors(
            ("15b3", "8086"), ("ens1np0",), ("Ethernet",), ("0000:1c:00.0",), ("mlx5_0",)
        ),
    )
    assert not config.pairing.enabled
    assert config.health.disabled_xids == {13, 31}


def test_yaml_merge_keys_are_honoured() -> None:
    text = "roce: {selectors: &sel {ifNames: [a]}}\nflags: {migStrategy: single}\n"
    assert parse_config(text, "c.yaml").roce.selectors.if_names == ("a",)
    merged = "health: &h {disabledXids: [1]}\npairing: {<<: {enabled: false}}\n"
    assert not parse_config(merged, "c.yaml").pairing.enabled


BAD = [
    ("not-a-mapping", "- a\n", "(top level)", "a mapping, got a list"),
    ("scalar-document", "hello\n", "(top level)", "a mapping, got 'hello'"),
    ("unknown-top-key", "flagz: {}\n", "flagz", "unknown key"),
    ("unknown-nested-key", "flags: {migstrategy: none}\n", "flags.migstrategy", "migStrategy"),
    ("unknown-plugin-key", "flags: {plugin: {foo: 1}}\n", "flags.plugin.foo", "unknown key"),
    ("version", "version: v2\n", "version", "one of v1, got 'v2'"),
    ("version-int", "version: 1\n", "version", "one of v1, got 1"),
    (
        "mig-strategy",
        "flags: {migStrategy: all}\n",
        "flags.migStrategy",
        "one of none, single, mixed",
    ),
    ("id-strategy", "flags: {deviceIDStrategy: serial}\n", "flags.deviceIDStrategy", "uuid, index"),
    (
        "bool-as-string",
        "flags: {failOnInitError: 'true'}\n",
        "flags.failOnInitError",
        "true or false",
    ),
    ("bool-as-int", "pairing: {enabled: 1}\n", "pairing.enabled", "true or false, got 1"),
    ("section-as-list", "flags: []\n", "flags", "a mapping, got a list"),
    (
        "list-strategy-unknown",
        "flags: {deviceListStrategy: [envvar, volume-mount]}\n",
        "flags.deviceListStrategy[1]",
        "one of envvar, volume-mounts, cdi-annotations, cdi-cri, got 'volume-mount'",
    ),
    (
        "list-strategy-empty",
        "flags: {deviceListStrategy: []}\n",
        "flags.deviceListStrategy",
        "non-empty",
    ),
    (
        "plugin-disagrees",
        "flags: {passDeviceSpecs: true, plugin: {passDeviceSpecs: false}}\n",
        "flags.plugin.passDeviceSpecs",
        "the same value as flags.passDeviceSpecs (true), got false",
    ),
    (
        "replicas-zero",
        TS % "{resources: [{name: nvidia.com/gpu, replicas: 0}]}",
        "sharing.timeSlicing.resources[0].replicas",
        "an integer >= 1, got 0",
    ),
    (
        "replicas-bool",
        TS % "{resources: [{name: nvidia.com/gpu, replicas: true}]}",
        "sharing.timeSlicing.resources[0].replicas",
        "an integer >= 1, got true",
    ),
    (
        "replicas-missing",
        TS % "{resources: [{name: nvidia.com/gpu}]}",
        "sharing.timeSlicing.resources[0].replicas",
        "required",
    ),
    (
        "name-missing",
        TS % "{resources: [{replicas: 2}]}",
        "sharing.timeSlicing.resources[0].name",
        "required",
    ),
    (
        "resources-as-string",
        TS % "{resources: nvidia.com/gpu}",
        "sharing.timeSlicing.resources",
        "a list",
    ),
    (
        "duplicate-resource",
        TS % "{resources: [{name: nvidia.com/gpu, replicas: 2}, {name: gpu, replicas: 3}]}",
        "sharing.timeSlicing.resources[1].name",
        "not used before, got 'nvidia.com/gpu' (also at sharing.timeSlicing.resources[0].name)",
    ),
    (
        "rename-collides",
        TS
        % "{resources: [{name: gpu, replicas: 2}, {name: mig-1g.10gb, rename: gpu, replicas: 3}]}",
        "sharing.timeSlicing.resources[1].rename",
        "not used before, got 'nvidia.com/gpu'",
    ),
    (
        "resource-name-invalid",
        TS % "{resources: [{name: 'nvidia.com/gpu!', replicas: 2}]}",
        "sharing.timeSlicing.resources[0].name",
        "extended resource name",
    ),
    (
        "resource-name-not-gpu",
        TS % "{resources: [{name: example.com/foo, replicas: 2}]}",
        "sharing.timeSlicing.resources[0].name",
        "nvidia.com/gpu or nvidia.com/mig-<profile>",
    ),
    (
        "rename-invalid",
        TS % "{resources: [{name: gpu, rename: 'a/b/c', replicas: 2}]}",
        "sharing.timeSlicing.resources[0].rename",
        "extended resource name",
    ),
    (
        "devices-zero",
        TS % "{resources: [{name: gpu, replicas: 2, devices: 0}]}",
        "sharing.timeSlicing.resources[0].devices",
        '"all", a GPU count >= 1',
    ),
    (
        "devices-empty",
        TS % "{resources: [{name: gpu, replicas: 2, devices: []}]}",
        "sharing.timeSlicing.resources[0].devices",
        "non-empty",
    ),
    (
        "devices-bad-ref",
        TS % "{resources: [{name: gpu, replicas: 2, devices: [first]}]}",
        "sharing.timeSlicing.resources[0].devices[0]",
        "a GPU index or UUID",
    ),
    (
        "mps-without-root",
        "sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}\n",
        "flags.mpsRoot",
        "a host directory for MPS pipes and logs",
    ),
    (
        "mps-with-mixed",
        "flags: {migStrategy: mixed, mpsRoot: /run/nvidia/mps}\n"
        "sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}\n",
        "flags.migStrategy",
        "none or single with sharing.mps",
    ),
    (
        "mps-more-than-an-mps-server-takes",
        "flags: {mpsRoot: /run/nvidia/mps}\n"
        "sharing: {mps: {resources: [{name: gpu, replicas: 49}]}}\n",
        "sharing.mps.resources[0].replicas",
        "at most 48",
    ),
    ("mps-empty", "sharing: {mps: {}}\n", "sharing.mps.resources", "at least one resource"),
    (
        "mps-typo-named-first",
        "sharing: {mps: {resource: []}}\n",
        "sharing.mps.resource",
        "unknown key",
    ),
    (
        "pattern-rename-without-name",
        "resources: {gpus: [{pattern: '*A100*'}]}\n",
        "resources.gpus[0].name",
        "required",
    ),
    (
        "pattern-rename-unknown-key",
        "resources: {gpus: [{pattern: '*A100*', name: a, devices: all}]}\n",
        "resources.gpus[0].devices",
        "unknown key",
    ),
    ("imex-channel-1", "imex: {channelIDs: [1]}\n", "imex.channelIDs", "[] or [0]"),
    ("imex-two-channels", "imex: {channelIDs: [0, 1]}\n", "imex.channelIDs", "got [0, 1]"),
    ("imex-channel-negative", "imex: {channelIDs: [-1]}\n", "imex.channelIDs[0]", ">= 0"),
    ("imex-required-string", "imex: {required: 'yes'}\n", "imex.required", "true or false"),
    (
        "shared-policy",
        "flags: {plugin: {sharedDevicesAllocationPolicy: spread}}\n",
        "flags.plugin.sharedDevicesAllocationPolicy",
        "one of distributed, packed, got 'spread'",
    ),
    (
        "annotation-prefix-without-slash",
        "flags: {plugin: {cdiAnnotationPrefix: cdi.k8s.io}}\n",
        "flags.plugin.cdiAnnotationPrefix",
        "an annotation key prefix such as cdi.k8s.io/",
    ),
    (
        "driver-root-relative",
        "flags: {nvidiaDriverRoot: run/nvidia/driver}\n",
        "flags.nvidiaDriverRoot",
        "an absolute path",
    ),
    ("gds-string", "flags: {gdsEnabled: 'yes'}\n", "flags.gdsEnabled", "true or false"),
    ("gdrcopy-int", "flags: {gdrcopyEnabled: 1}\n", "flags.gdrcopyEnabled", "true or false"),
    (
        "discovery-strategy",
        "flags: {deviceDiscoveryStrategy: pci}\n",
        "flags.deviceDiscoveryStrategy",
        "one of auto, nvml, tegra",
    ),
    (
        "sleep-interval",
        "flags: {gfd: {sleepInterval: forever}}\n",
        "flags.gfd.sleepInterval",
        "a duration such as 60s, or infinite",
    ),
    ("gfd-bool", "flags: {gfd: {oneshot: maybe}}\n", "flags.gfd.oneshot", "true or false"),
    (
        "driver-root-int",
        "flags: {nvidiaDriverRoot: 1}\n",
        "flags.nvidiaDriverRoot",
        "an absolute path such as /run/nvidia/driver, got 1",
    ),
    (
        "roce-resource-name",
        "roce: {resourceName: roce}\n",
        "roce.resourceName",
        "extended resource name domain/name",
    ),
    (
        "roce-native-domain",
        "roce: {resourceName: kubernetes.io/roce}\n",
        "roce.resourceName",
        "extended resource name",
    ),
    (
        "vendor-unquoted",
        "roce: {selectors: {vendors: [8086]}}\n",
        "roce.selectors.vendors[0]",
        "4-hex-digit vendor ID",
    ),
    (
        "vendor-long",
        "roce: {selectors: {vendors: ['15b33']}}\n",
        "roce.selectors.vendors[0]",
        "got '15b33'",
    ),
    (
        "vendors-empty",
        "roce: {selectors: {vendors: []}}\n",
        "roce.selectors.vendors",
        "a non-empty list, got []",
    ),
    (
        "infiniband",
        "roce: {selectors: {linkLayers: [InfiniBand]}}\n",
        "roce.selectors.linkLayers[0]",
        "InfiniBand devices are not the RoCE family",
    ),
    (
        "link-layers-empty",
        "roce: {selectors: {linkLayers: []}}\n",
        "roce.selectors.linkLayers",
        "non-empty",
    ),
    (
        "if-names-string",
        "roce: {selectors: {ifNames: ens1}}\n",
        "roce.selectors.ifNames",
        "a list, got 'ens1'",
    ),
    (
        "pci-address",
        "roce: {selectors: {pciAddresses: ['1c:00.0']}}\n",
        "roce.selectors.pciAddresses[0]",
        "a PCI address",
    ),
    (
        "replicas-over-the-bound",
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 100000000}]}}\n",
        "sharing.timeSlicing.resources[0].replicas",
        "at most 1024 (replicas per GPU or MIG instance), got 100000000",
    ),
    (
        "replicas-one-over-the-bound-in-a-later-entry",
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2},"
        " {name: nvidia.com/mig-1g.10gb, replicas: 1025}]}}\n",
        "sharing.timeSlicing.resources[1].replicas",
        "at most 1024",
    ),
    (
        "xid-zero",
        "health: {disabledXids: [0]}\n",
        "health.disabledXids[0]",
        "an integer >= 1, got 0",
    ),
    (
        "xid-string",
        "health: {disabledXids: ['79']}\n",
        "health.disabledXids[0]",
        "an integer >= 1, got '79'",
    ),
    (
        "duplicate-key",
        "flags:\n  migStrategy: none\n  migStrategy: mixed\n",
        "line 3",
        "a key given once",
    ),
    ("syntax-error", "flags:\n  migStrategy: [none\n", "line 3", "valid YAML"),
    ("tab-indent", "flags:\n\tmigStrategy: none\n", "line 2", "valid YAML"),
    ("two-documents", "a: 1\n---\nb: 2\n", "line 2", "valid YAML"),
    ("python-tag", "flags: !!python/object:os.system {}\n", "line 1", "valid YAML"),
    ("impossible-date", "version: 2024-13-40\n", "(document)", "month must be in 1..12"),
]


@pytest.mark.parametrize(
    ("text", "key", "expected"), [case[1:] for case in BAD], ids=[case[0] for case in BAD]
)
def test_bad_config_is_a_config_error_naming_key_and_expectation(
    text: str, key: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "/etc/node-agent/config.yaml")
    message = str(caught.value)
    assert message.startswith(f"/etc/node-agent/config.yaml: {key}")
    assert expected in message
    assert "\n" not in message


def test_load_config_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("flags: {migStrategy: mixed}\n")
    assert load_config(path).flags.mig_strategy == "mixed"


def test_missing_config_file_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match=r"absent.yaml: \(file\): a readable UTF-8 file"):
        load_config(path)


KNOWN_KEYS = [
    *("version", "flags", "sharing", "roce", "pairing", "health", "resources", "imex"),
    *("migStrategy", "failOnInitError", "deviceIDStrategy", "deviceListStrategy", "plugin"),
    *("passDeviceSpecs", "gfd", "timeSlicing", "mps", "name", "replicas", "rename", "devices"),
    *("selectors", "vendors", "linkLayers", "enabled", "disabledXids", "gpus", "channelIDs"),
    *("gdsEnabled", "mofedEnabled", "gdrcopyEnabled", "nvidiaDriverRoot", "nvidiaDevRoot"),
    *("cdiAnnotationPrefix", "sharedDevicesAllocationPolicy", "mig", "pattern", "required"),
]
SCALARS = st.none() | st.booleans() | st.integers(-5, 10**20) | st.floats() | st.text(max_size=12)
VALUES = st.recursive(
    SCALARS | st.sampled_from(["v1", "none", "mixed", "envvar", "nvidia.com/gpu", "all", "15b3"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KNOWN_KEYS) | st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_any_yaml_document_parses_or_is_a_config_error(document: object) -> None:
    text = yaml.safe_dump(document)
    try:
        parse_config(text, "c.yaml")
    except ConfigError as err:
        assert "\n" not in str(err)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab:-[]{}#&*!|>'\"\n\t 0123456789.,?")), max_size=60))
def test_any_text_parses_or_is_a_config_error(text: str) -> None:
    try:
        parse_config(text, "c.yaml")
    except ConfigError as err:
        assert "\n" not in str(err)


def test_fabric_defaults_to_our_label_keys_and_no_spines() -> None:
    assert Config.default().fabric == Fabric((), ("node-agents",))


def test_fabric_spines_and_label_keys_are_read() -> None:
    text = (
        "fabric:\n  spines: {leaf-b: spine-1, leaf-a: spine-1, 'b8:59:9f:00:00:01': spine-2}\n"
        "  labelKeys: [topograph, node-agents, topograph]\n"
    )
    fabric = parse_config(text, "c.yaml").fabric
    assert fabric.spine_map == {
        "leaf-a": "spine-1",
        "leaf-b": "spine-1",
        "b8:59:9f:00:00:01": "spine-2",
    }
    assert fabric.label_keys == ("topograph", "node-agents")


BAD_FABRIC = [
    ("unknown-key", "fabric: {spine: {}}\n", "fabric.spine", "unknown key"),
    ("spines-list", "fabric: {spines: [a]}\n", "fabric.spines", "a mapping, got a list"),
    ("spine-number", "fabric: {spines: {leaf-a: 7}}\n", "fabric.spines.leaf-a", "a label value"),
    ("spine-bad", "fabric: {spines: {leaf-a: 'sp ine'}}\n", "fabric.spines.leaf-a", "label value"),
    ("leaf-number", "fabric: {spines: {7: s}}\n", "fabric.spines", "a non-empty string, got 7"),
    ("key-set", "fabric: {labelKeys: [nvidia]}\n", "fabric.labelKeys[0]", "one of node-agents"),
    ("key-string", "fabric: {labelKeys: topograph}\n", "fabric.labelKeys", "a list"),
]


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [case[1:] for case in BAD_FABRIC],
    ids=[case[0] for case in BAD_FABRIC],
)
def test_bad_fabric_config_is_a_config_error_naming_the_key(
    text: str, key: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "c.yaml")
    assert str(caught.value).startswith(f"c.yaml: {key}")
    assert expected in str(caught.value)
