"""What a container is told of its GPUs through Allocate, for every combination of the
device-list strategies, with and without device specs and the driver features: the GPU
family's container edits as the device-plugin runtime answers them."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest

from agents.api import api_pb2 as pb
from agents.config import Flags
from agents.gpu.allocation import GpuNodes, gpu_edits
from agents.gpu.plan import Unit
from agents.plugin import wire

STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
COMBINATIONS = [frozenset(c) for n in range(1, 5) for c in itertools.combinations(STRATEGIES, n)]
NAMES = ["GPU-a", "GPU-b"]
UNITS = tuple(Unit(n, n, n, numa=0, index=str(i)) for i, n in enumerate(NAMES))
MINORS = {"GPU-a": 3, "GPU-b": 4}
CONTROL = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
KEY = re.compile(
    r"cdi\.k8s\.io/nvidia-device-plugin_[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}"
)


def answer(
    flags: Flags,
    units: Sequence[Unit] = UNITS,
    *,
    dev_root: str = "",
    response_id: Callable[[], str] = wire.new_response_id,
) -> pb.ContainerAllocateResponse:
    edits = gpu_edits("nvidia.com/gpu", units, flags, GpuNodes(MINORS, {}, dev_root))
    return wire.allocation_message(edits, flags, response_id=response_id)


def specs(got: pb.ContainerAllocateResponse) -> list[tuple[str, str, str]]:
    return [(d.container_path, d.host_path, d.permissions) for d in got.devices]


@pytest.mark.parametrize("passed", [False, True], ids=["no-specs", "specs"])
@pytest.mark.parametrize("lists", COMBINATIONS, ids=["+".join(sorted(c)) for c in COMBINATIONS])
def test_each_strategy_adds_its_own_part_of_the_answer(lists: frozenset[str], passed: bool) -> None:
    got = answer(Flags(device_list_strategy=lists, pass_device_specs=passed))
    only_cdi = all(s.startswith("cdi-") for s in lists)
    visible = None
    if "envvar" in lists:
        visible = "GPU-a,GPU-b"
    if "volume-mounts" in lists:
        visible = "/var/run/nvidia-container-devices"
    assert dict(got.envs) == ({} if visible is None else {"NVIDIA_VISIBLE_DEVICES": visible})
    mounts = [(f"/var/run/nvidia-container-devices/{n}", "/dev/null", False) for n in NAMES]
    got_mounts = [(m.container_path, m.host_path, m.read_only) for m in got.mounts]
    assert got_mounts == (mounts if "volume-mounts" in lists else [])
    cdi = ["nvidia.com/gpu=GPU-a", "nvidia.com/gpu=GPU-b"]
    assert [d.name for d in got.cdi_devices] == (cdi if "cdi-cri" in lists else [])
    if "cdi-annotations" in lists:
        [(key, value)] = got.annotations.items()
        assert KEY.fullmatch(key) and value == ",".join(cdi)
    else:
        assert dict(got.annotations) == {}
    paths = [*CONTROL, "/dev/nvidia3", "/dev/nvidia4"]
    want = [(p, p, "rw") for p in paths] if passed and not only_cdi else []
    assert specs(got) == want


def test_each_answer_gets_a_fresh_annotation_key() -> None:
    flags = Flags(device_list_strategy=frozenset({"cdi-annotations"}))
    keys = {next(iter(answer(flags).annotations)) for _ in range(3)}
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
    features = Flags(gds_enabled=gds, mofed_enabled=mofed, gdrcopy_enabled=gdrcopy)
    by_index = replace(features, device_id_strategy="index")
    got = answer(replace(features, device_list_strategy=frozenset({"cdi-cri"})), UNITS[:1])
    assert dict(got.envs) == envs
    assert [d.name for d in got.cdi_devices] == ["nvidia.com/gpu=GPU-a", *extra]
    assert dict(answer(by_index, UNITS[:1]).envs) == {**envs, "NVIDIA_VISIBLE_DEVICES": "0"}


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
    got = specs(answer(flags, UNITS[:1], dev_root=sim))
    assert got[-1] == ("/dev/nvidia3", host, "rw")


def test_a_custom_annotation_prefix_replaces_the_default() -> None:
    flags = Flags(
        device_list_strategy=frozenset({"cdi-annotations"}),
        cdi_annotation_prefix="nvidia.cdi.k8s.io/",
    )
    [key] = answer(flags, response_id=lambda: "r1").annotations
    assert key == "nvidia.cdi.k8s.io/nvidia-device-plugin_r1"


def test_each_device_names_its_own_nodes_beside_the_shared_ones() -> None:
    """What DRA writes per device: the control devices and that GPU's own node."""
    edits = gpu_edits("nvidia.com/gpu", UNITS, Flags(), GpuNodes(MINORS, {}))
    own = {key: [n.container_path for n in nodes] for key, nodes in edits.device_nodes.items()}
    assert own == {
        ("nvidia.com/gpu", "GPU-a"): [*CONTROL, "/dev/nvidia3"],
        ("nvidia.com/gpu", "GPU-b"): [*CONTROL, "/dev/nvidia4"],
    }
    assert edits.named_env() == {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}


@pytest.mark.parametrize("lists", COMBINATIONS, ids=["+".join(sorted(c)) for c in COMBINATIONS])
def test_mps_clients_get_the_pipe_and_shm_of_their_resource_whatever_names_the_gpus(
    lists: frozenset[str],
) -> None:
    flags = Flags(device_list_strategy=lists, mps_root="/run/nvidia/mps")
    where = GpuNodes(MINORS, {}, "/sim", mps_root="/run/nvidia/mps")
    edits = gpu_edits("nvidia.com/gpu.shared", UNITS[:1], flags, where)
    got = wire.allocation_message(edits, flags)
    assert got.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu.shared/pipe"
    mps_mounts = [(m.container_path, m.host_path, m.read_only) for m in got.mounts][:2]
    assert mps_mounts == [
        (
            "/mps/nvidia.com/gpu.shared/pipe",
            "/sim/run/nvidia/mps/nvidia.com/gpu.shared/pipe",
            False,
        ),
        ("/dev/shm", "/sim/run/nvidia/mps/shm", False),
    ]


def test_gpus_not_shared_through_mps_get_no_mps_variable_nor_mount() -> None:
    flags = Flags(mps_root="/run/nvidia/mps")
    got = wire.allocation_message(
        gpu_edits("nvidia.com/gpu", UNITS, flags, GpuNodes(MINORS, {})), flags
    )
    assert not any(k.startswith("CUDA_MPS") for k in got.envs)
    assert list(got.mounts) == []
