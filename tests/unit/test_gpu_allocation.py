"""What a container is told of its GPUs, for every combination of the device-list
strategies, with and without device specs and the driver features."""

from __future__ import annotations

import itertools
import re

import pytest

from agents.config import Flags
from agents.core.device import DeviceSpec, Mount
from agents.gpu.allocation import container_allocation

STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
COMBINATIONS = [frozenset(c) for n in range(1, 5) for c in itertools.combinations(STRATEGIES, n)]
NAMES = ["GPU-a", "GPU-b"]
PATHS = ["/dev/nvidiactl", "/dev/nvidia3"]
KEY = re.compile(
    r"cdi\.k8s\.io/nvidia-device-plugin_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}"
)


@pytest.mark.parametrize("specs", [False, True], ids=["no-specs", "specs"])
@pytest.mark.parametrize("lists", COMBINATIONS, ids=["+".join(sorted(c)) for c in COMBINATIONS])
def test_each_strategy_adds_its_own_part_of_the_answer(lists: frozenset[str], specs: bool) -> None:
    flags = Flags(device_list_strategy=lists, pass_device_specs=specs)
    got = container_allocation(NAMES, PATHS, flags)
    only_cdi = all(s.startswith("cdi-") for s in lists)
    visible = None
    if "envvar" in lists:
        visible = "GPU-a,GPU-b"
    if "volume-mounts" in lists:
        visible = "/var/run/nvidia-container-devices"
    assert got.envs == ({} if visible is None else {"NVIDIA_VISIBLE_DEVICES": visible})
    mounts = [Mount(f"/var/run/nvidia-container-devices/{n}", "/dev/null", False) for n in NAMES]
    assert list(got.mounts) == (mounts if "volume-mounts" in lists else [])
    cdi = ["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"]
    assert list(got.cdi_devices) == (cdi if "cdi-cri" in lists else [])
    if "cdi-annotations" in lists:
        [(key, value)] = got.annotations.items()
        assert KEY.fullmatch(key) and value == ",".join(cdi)
    else:
        assert got.annotations == {}
    want_specs = [DeviceSpec(p, p, "rw") for p in PATHS] if specs and not only_cdi else []
    assert list(got.devices) == want_specs


def test_each_answer_gets_a_fresh_annotation_key() -> None:
    flags = Flags(device_list_strategy=frozenset({"cdi-annotations"}))
    keys = {next(iter(container_allocation(NAMES, [], flags).annotations)) for _ in range(3)}
    assert len(keys) == 3


@pytest.mark.parametrize(
    ("gds", "mofed", "gdrcopy", "envs", "extra"),
    [
        (True, False, False, {"NVIDIA_GDS": "enabled"}, ["nvidia.com/gds=all"]),
        (False, True, False, {"NVIDIA_MOFED": "enabled"}, ["nvidia.com/mofed=all"]),
        (False, False, True, {"NVIDIA_GDRCOPY": "enabled"}, ["nvidia.com/gdrcopy=all"]),
        (
            True,
            True,
            True,
            {"NVIDIA_GDS": "enabled", "NVIDIA_MOFED": "enabled", "NVIDIA_GDRCOPY": "enabled"},
            ["nvidia.com/gdrcopy=all", "nvidia.com/gds=all", "nvidia.com/mofed=all"],
        ),
    ],
    ids=["gds", "mofed", "gdrcopy", "all-three"],
)
def test_driver_features_add_their_env_and_cdi_devices(
    gds: bool, mofed: bool, gdrcopy: bool, envs: dict[str, str], extra: list[str]
) -> None:
    flags = Flags(
        device_list_strategy=frozenset({"cdi-cri"}),
        gds_enabled=gds,
        mofed_enabled=mofed,
        gdrcopy_enabled=gdrcopy,
    )
    got = container_allocation(["0"], [], flags)
    assert got.envs == envs
    assert list(got.cdi_devices) == ["nvidia.com/gpu=0", *extra]
    assert container_allocation(
        ["0"], [], Flags(gds_enabled=gds, mofed_enabled=mofed, gdrcopy_enabled=gdrcopy)
    ).envs == {
        **envs,
        "NVIDIA_VISIBLE_DEVICES": "0",
    }


@pytest.mark.parametrize(
    ("driver", "dev", "sim", "host"),
    [
        ("/", None, "", "/dev/nvidia3"),
        ("/run/nvidia/driver", None, "", "/run/nvidia/driver/dev/nvidia3"),
        ("/run/nvidia/driver", "/", "", "/dev/nvidia3"),
        ("/", "/host-dev/", "", "/host-dev/dev/nvidia3"),
        ("/run/nvidia/driver", None, "/tmp/sim", "/tmp/sim/run/nvidia/driver/dev/nvidia3"),
    ],
    ids=["default", "driver-root", "dev-root-wins", "trailing-slash", "simulated-node"],
)
def test_device_specs_live_under_the_device_root_on_the_host(
    driver: str, dev: str | None, sim: str, host: str
) -> None:
    flags = Flags(pass_device_specs=True, nvidia_driver_root=driver, nvidia_dev_root=dev)
    got = container_allocation(["GPU-a"], ["/dev/nvidia3"], flags, dev_root=sim)
    assert list(got.devices) == [DeviceSpec("/dev/nvidia3", host, "rw")]


def test_a_custom_annotation_prefix_replaces_the_default() -> None:
    flags = Flags(
        device_list_strategy=frozenset({"cdi-annotations"}),
        cdi_annotation_prefix="nvidia.cdi.k8s.io/",
    )
    [key] = container_allocation(NAMES, [], flags, response_id=lambda: "r1").annotations
    assert key == "nvidia.cdi.k8s.io/nvidia-device-plugin_r1"
