"""DRA mode on the real NVML backend (pynvml, no --simulate) over the project's test NVML
library: an H100 node's GPUs and the MIG layouts' instances in the slice under their DRA
names, a claim for a MIG device prepared with its UUID in the CDI env, and an XID that
NVML reports taking the device (or a parent's instances) out of the slice."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conditions import PROCESS_WAIT as WAIT
from tests.integration.dra_node import GPU, DraNode, dra_node, ref
from tests.nvml import mig
from tests.nvml.harness import Lab, lab_for
from tests.nvml.state import Mig
from tests.timing import SHORT

__all__ = ["dra_node"]

XID_FELL_OFF_BUS = 79
XID_APPLICATION = 13  # the application's fault, not the GPU's: the device stays


def mig_name(minor: int, m: Mig) -> str:
    """gpu-<parent minor>-mig-<profile without '.'>-<GI profile ID, as NVML numbers
    them (not the profile's index)>-<placement start>."""
    profile_id = mig.gi_profile(m.profile).id
    return f"gpu-{minor}-mig-{m.profile.replace('.', '')}-{profile_id}-{m.start}"


def expected(lab: Lab) -> dict[str, str]:
    """DRA device name -> UUID of every device the lab's node offers: MIG instances of a
    MIG-enabled GPU, the others whole."""
    out = {}
    for gpu in lab.node.gpus:
        if not gpu.mig:
            out[f"gpu-{gpu.minor}"] = gpu.uuid
        for m in gpu.migs:
            out[mig_name(gpu.minor, m)] = m.uuid
    return out


def env(spec: dict[str, Any] | None) -> dict[str, str]:
    assert spec is not None
    [device] = [d for d in spec["devices"] if d["name"].endswith("-env")]
    return dict(e.split("=", 1) for e in device["containerEdits"]["env"])


async def started(node: DraNode, lab: Lab) -> None:
    agent = await node.start(None, "--families", "gpu", drivers=(GPU,), env=lab.env())
    want = expected(lab)
    try:
        await node.wait(lambda: set(node.devices(GPU)) == set(want))
    finally:
        print(agent.stderr[-2000:])
    for name, uuid in want.items():
        assert node.devices(GPU)[name]["attributes"]["uuid"] == {"string": uuid}


@pytest.fixture
async def h100(dra_node: DraNode, tmp_path: Path) -> AsyncIterator[Lab]:
    lab = lab_for("own", "h100", tmp_path)
    await started(dra_node, lab)
    yield lab


async def test_h100_gpus_are_published_and_an_xid_takes_one_out_until_a_reset(
    dra_node: DraNode, h100: Lab
) -> None:
    gpus = h100.node.gpus
    assert sorted(dra_node.devices(GPU)) == sorted(f"gpu-{g.minor}" for g in gpus)
    first = dra_node.devices(GPU)[f"gpu-{gpus[0].minor}"]["attributes"]
    assert first["type"] == {"string": "gpu"}
    assert first["driverVersion"] == {"version": "550.163.1"}

    dra_node.claim("whole", [("gpu", GPU, f"gpu-{gpus[0].minor}")])
    answer = await dra_node.kubelet.prepare(GPU, [ref("whole")])
    assert answer.claims["whole"].error == ""
    assert env(dra_node.spec(GPU, "whole"))["NVIDIA_VISIBLE_DEVICES"] == gpus[0].uuid

    victim = f"gpu-{gpus[3].minor}"
    h100.fail(3, "fallen_off_bus")
    began = time.monotonic()
    await dra_node.wait(lambda: victim not in dra_node.devices(GPU))
    print(f"real NVML XID 79 -> out of the slice after {(time.monotonic() - began) * 1000:.0f} ms")
    assert len(dra_node.devices(GPU)) == len(gpus) - 1
    dra_node.claim("late", [("gpu", GPU, victim)])
    answer = await dra_node.kubelet.prepare(GPU, [ref("late")])
    assert victim in answer.claims["late"].error and "Unhealthy" in answer.claims["late"].error

    h100.reset(3)
    await dra_node.wait(lambda: victim in dra_node.devices(GPU), WAIT + SHORT.gpu_hold_s)
    answer = await dra_node.kubelet.prepare(GPU, [ref("late")])
    assert answer.claims["late"].error == ""


async def test_a100_mixed_publishes_each_instance_and_prepares_one_by_its_uuid(
    dra_node: DraNode, tmp_path: Path
) -> None:
    lab = lab_for("own", "a100-mixed", tmp_path)
    await started(dra_node, lab)
    devices = dra_node.devices(GPU)
    parent = lab.node.gpus[0]
    three = next(m for m in parent.migs if m.profile == "3g.20gb")
    name = mig_name(parent.minor, three)
    attributes = devices[name]["attributes"]
    assert attributes["type"] == {"string": "mig"}
    assert attributes["parentUUID"] == {"string": parent.uuid}
    assert attributes["profile"] == {"string": "3g.20gb"}
    assert f"gpu-{parent.minor}" not in devices  # a MIG-enabled GPU offers its instances

    dra_node.claim("mig", [("mig", GPU, name)])
    answer = await dra_node.kubelet.prepare(GPU, [ref("mig")])
    prepared = answer.claims["mig"]
    assert prepared.error == ""
    assert [d.device_name for d in prepared.devices] == [name]
    assert env(dra_node.spec(GPU, "mig"))["NVIDIA_VISIBLE_DEVICES"] == three.uuid

    # An application XID first: once the XID 79 after it shows, it was seen and ignored.
    lab.node.xid(1, XID_APPLICATION)
    lab.node.xid(0, XID_FELL_OFF_BUS)
    lab.apply()
    gone = {n for n in expected(lab) if n.startswith(f"gpu-{parent.minor}-mig-")}
    await dra_node.wait(lambda: not gone & set(dra_node.devices(GPU)))
    assert set(dra_node.devices(GPU)) == set(expected(lab)) - gone


async def test_h100_uniform_publishes_56_instances_and_no_whole_gpu(
    dra_node: DraNode, tmp_path: Path
) -> None:
    lab = lab_for("own", "h100-uniform", tmp_path)
    await started(dra_node, lab)
    devices = dra_node.devices(GPU)
    assert len(devices) == 56
    assert all("-mig-1g10gb-" in n for n in devices)
    gpu = lab.node.gpus[5]
    instance = gpu.migs[2]
    name = mig_name(gpu.minor, instance)
    assert name == f"gpu-{gpu.minor}-mig-1g10gb-19-{instance.start}"
    dra_node.claim("one", [("mig", GPU, name)])
    answer = await dra_node.kubelet.prepare(GPU, [ref("one")])
    assert answer.claims["one"].error == ""
    assert env(dra_node.spec(GPU, "one"))["NVIDIA_VISIBLE_DEVICES"] == instance.uuid
