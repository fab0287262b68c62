"""IMEX channels as NVIDIA's device plugin v0.20 hands them out: where the channel is
looked for, what a missing one does, and what every GPU container is told of it for each
device-list strategy, with and without device specs."""

from __future__ import annotations

import itertools
import os
import stat
from pathlib import Path

import pytest
import structlog

from agents.api import api_pb2 as pb
from agents.config import Flags, Imex
from agents.errors import BackendError, ConfigError
from agents.gpu.allocation import GpuNodes, gpu_edits
from agents.gpu.imex import imex_channels
from agents.gpu.plan import Unit
from agents.hw.imex_channels import find_channel
from agents.kernel.edits import merged
from agents.plugin import wire
from agents.sim.devnodes import DeviceNodes
from agents.sim.node import parse_node

STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
COMBINATIONS = [frozenset(c) for n in range(1, 5) for c in itertools.combinations(STRATEGIES, n)]
UNITS = (Unit("GPU-a", "GPU-a", "GPU-a", numa=0, index="0"),)
CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a char device")


def answer(flags: Flags, channels: tuple[int, ...] = (0,)) -> pb.ContainerAllocateResponse:
    edits = gpu_edits("nvidia.com/gpu", UNITS, flags, GpuNodes({"GPU-a": 0}, {}, "", channels))
    return wire.allocation_message(edits, flags, response_id=lambda: "r")


@pytest.mark.parametrize("passed", [False, True], ids=["no-specs", "specs"])
@pytest.mark.parametrize("lists", COMBINATIONS, ids=["+".join(sorted(c)) for c in COMBINATIONS])
def test_every_strategy_names_the_channel_as_nvidias_plugin_does(
    lists: frozenset[str], passed: bool
) -> None:
    got = answer(Flags(device_list_strategy=lists, pass_device_specs=passed))
    only_cdi = all(s.startswith("cdi-") for s in lists)
    env = dict(got.envs).get("NVIDIA_IMEX_CHANNELS")
    assert env == ("0" if "envvar" in lists else None)
    mounts = [(m.container_path, m.host_path) for m in got.mounts if "/imex/" in m.container_path]
    imex_mount = ("/var/run/nvidia-container-devices/imex/0", "/dev/null")
    assert mounts == ([imex_mount] if "volume-mounts" in lists else [])
    cdi = ["nvidia.com/gpu=GPU-a", "nvidia.com/imex-channel=0"]
    assert [d.name for d in got.cdi_devices] == (cdi if "cdi-cri" in lists else [])
    annotations = {"cdi.k8s.io/nvidia-device-plugin_r": ",".join(cdi)}
    assert dict(got.annotations) == (annotations if "cdi-annotations" in lists else {})
    nodes = [(d.container_path, d.host_path, d.permissions) for d in got.devices]
    assert nodes[-1:] == ([(CHANNEL, CHANNEL, "rw")] if passed and not only_cdi else [])


def test_without_a_channel_the_answer_names_none() -> None:
    flags = Flags(device_list_strategy=frozenset(STRATEGIES), pass_device_specs=True)
    got = answer(flags, channels=())
    assert "NVIDIA_IMEX_CHANNELS" not in got.envs
    assert not [m for m in got.mounts if "/imex/" in m.container_path]
    assert [d.name for d in got.cdi_devices] == ["nvidia.com/gpu=GPU-a"]
    assert CHANNEL not in [d.container_path for d in got.devices]


def test_the_channel_comes_before_the_driver_features_and_under_the_dev_root() -> None:
    flags = Flags(
        device_list_strategy=frozenset({"cdi-cri", "envvar"}),
        gds_enabled=True,
        pass_device_specs=True,
        nvidia_driver_root="/run/nvidia/driver",
    )
    got = answer(flags)
    names = ["nvidia.com/gpu=GPU-a", "nvidia.com/imex-channel=0", "nvidia.com/gds=all"]
    assert [d.name for d in got.cdi_devices] == names
    assert (got.devices[-1].container_path, got.devices[-1].host_path) == (
        CHANNEL,
        "/run/nvidia/driver" + CHANNEL,
    )


def test_two_resources_of_one_container_name_the_channel_once() -> None:
    nodes = GpuNodes({"GPU-a": 0, "GPU-b": 1}, {}, "", (0,))
    b = Unit("GPU-b", "GPU-b", "GPU-b", numa=0, index="1")
    one = merged(
        [gpu_edits(r, [u], Flags(), nodes) for r, u in (("gpu", UNITS[0]), ("gpu.shared", b))]
    )
    assert one.named_env() == {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b", "NVIDIA_IMEX_CHANNELS": "0"}
    assert [n.container_path for n in one.nodes].count(CHANNEL) == 1


def _char_device(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))


@needs_root
@pytest.mark.parametrize(
    ("made", "driver_root", "found"),
    [
        ("driver-root/dev", "/driver-root", "/driver-root" + CHANNEL),
        ("dev", "/driver-root", CHANNEL),  # no dev/ in the driver root: /dev
        ("dev", "/run/nvidia/driver", CHANNEL),  # a driver root without the channel
    ],
    ids=["under-the-driver-root", "driver-root-without-dev", "dev-beside-a-driver-root"],
)
def test_the_channel_is_found_where_nvidias_plugin_looks(
    tmp_path: Path, made: str, driver_root: str, found: str
) -> None:
    (tmp_path / "run/nvidia/driver/dev").mkdir(parents=True)
    _char_device(tmp_path / made / "nvidia-caps-imex-channels/channel0")
    assert find_channel(str(tmp_path), driver_root, 0) == str(tmp_path) + found


def test_a_file_that_is_no_character_device_is_no_channel(tmp_path: Path) -> None:
    channel = tmp_path / CHANNEL.lstrip("/")
    channel.parent.mkdir(parents=True)
    channel.write_text("")
    with pytest.raises(BackendError, match="channel0 is not a character device"):
        find_channel(str(tmp_path), "/driver-root", 0)


def test_an_absent_channel_is_named_where_it_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=f"^no {CHANNEL}$"):
        find_channel(str(tmp_path), "/driver-root", 0)


def test_a_required_channel_that_is_missing_refuses_the_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        imex_channels(Imex((0,), required=True), "/driver-root", str(tmp_path), "c.yaml")
    assert caught.value.key == "imex.channelIDs"
    assert "IMEX channel 0" in caught.value.expected


def test_a_missing_channel_not_required_is_left_out_with_one_warning(tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as logs:
        got = imex_channels(Imex((0,)), "/driver-root", str(tmp_path), "c.yaml")
    assert got == ()
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["imex_channel_missing"]


@needs_root
def test_a_present_channel_is_handed_out(tmp_path: Path) -> None:
    _char_device(tmp_path / CHANNEL.lstrip("/"))
    assert imex_channels(Imex((0,), True), "/driver-root", str(tmp_path), "c.yaml") == (0,)


@needs_root
def test_a_simulated_node_makes_its_channels_and_takes_them_away(tmp_path: Path) -> None:
    nodes = DeviceNodes(tmp_path)
    nodes.apply(parse_node("imex: {channels: [0]}\n", "node.yaml"))
    assert stat.S_ISCHR(os.stat(nodes.host_path(CHANNEL)).st_mode)
    nodes.apply(parse_node("imex: {channels: []}\n", "node.yaml"))
    assert not os.path.exists(nodes.host_path(CHANNEL))


def test_a_node_file_names_channels_by_number() -> None:
    with pytest.raises(ConfigError, match=r"imex\.channels\[0\]: an integer >= 0"):
        parse_node("imex: {channels: [x]}\n", "node.yaml")
