"""`node-agent run --api dra` end to end on a simulated node: both drivers registered with
the kubelet's plugin watcher, their ResourceSlices on the API server, prepare and
unprepare over real gRPC with CDI specs and one claim read each, per-claim errors, health
out of the slice and back (or as a taint), a restart that keeps prepared claims, and the
devices running pods hold through the device-plugin API kept out."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.api import dra_health_pb2
from agents.dra.runtime import REGISTRATION_WAIT_S
from agents.standin.admission import AllocatedContainer, PodAllocation
from agents.standin.checkpoint import (
    CHECKPOINT_NAME,
    CheckpointEntry,
    checkpoint_data,
    write_checkpoint,
)
from agents.standin.podresources import PodResourcesServer
from tests.conditions import PROCESS_WAIT as WAIT
from tests.integration.dra_node import GPU, NIC, NODE, DraNode, dra_node, ref
from tests.standin.apistore import MERGE
from tests.timing import SHORT

__all__ = ["dra_node"]

FAULT_OUT_WITHIN = 3.0  # docs/dra.md: an Unhealthy device leaves its slice within 3 s
CLAIM_GETS = "get", "resourceclaims"
RESOURCE = "nvidia.com/gpu"


def pairs(node: DraNode) -> dict[str, str]:
    """GPU device -> the first NIC device on its PCIe switch, from the slices."""

    def switch(device: dict[str, Any]) -> str | None:
        value = device["attributes"].get("node-agents.io/pcieSwitch")
        return None if value is None else str(value["string"])

    nics = node.devices(NIC)
    return {
        name: next(n for n, nic in sorted(nics.items()) if switch(nic) == switch(gpu))
        for name, gpu in sorted(node.devices(GPU).items())
    }


def env(spec: dict[str, Any]) -> dict[str, str]:
    [device] = [d for d in spec["devices"] if d["name"].endswith("-env")]
    return dict(e.split("=", 1) for e in device["containerEdits"]["env"])


async def test_both_drivers_register_and_publish_every_device_with_its_switch(
    dra_node: DraNode, node_file: Path, node_doc: dict[str, Any]
) -> None:
    agent = await dra_node.start(node_file)
    for driver in (GPU, NIC):
        registration = dra_node.watcher.drivers[driver]
        assert registration.versions[:2] == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
        assert registration.endpoint == str(dra_node.plugins / driver / "dra.sock")
        for path in (Path(registration.endpoint), dra_node.registry / f"{driver}-reg.sock"):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        [slice_] = dra_node.slices(driver)
        assert slice_["spec"]["pool"]["name"] == NODE
    gpus = dra_node.devices(GPU)
    assert sorted(gpus) == sorted(f"gpu-{g['minor']}" for g in node_doc["gpus"])
    gpu0 = gpus["gpu-0"]["attributes"]
    assert gpu0["type"] == {"string": "gpu"}
    assert gpu0["uuid"] == {"string": node_doc["gpus"][0]["uuid"]}
    assert "version" in gpu0["driverVersion"]
    assert len(dra_node.devices(NIC)) == len(node_doc["nics"])
    # The bundled node has a NIC on every GPU's switch.
    assert len(set(pairs(dra_node).values())) == len(gpus)
    assert agent.terminate() == 0
    for driver in (GPU, NIC):
        assert not (dra_node.registry / f"{driver}-reg.sock").exists()
        assert not (dra_node.plugins / driver / "dra.sock").exists()


async def test_a_paired_claim_is_prepared_per_driver_with_one_read_each(
    dra_node: DraNode, node_file: Path, node_doc: dict[str, Any]
) -> None:
    await dra_node.start(node_file)
    paired = pairs(dra_node)
    gpus = ["gpu-0", "gpu-1"]
    nics = [paired[g] for g in gpus]
    dra_node.claim(
        "u1",
        [
            ("gpu-0", GPU, gpus[0]),
            ("gpu-1", GPU, gpus[1]),
            ("nic-0", NIC, nics[0]),
            ("nic-1", NIC, nics[1]),
        ],
    )
    gets = dra_node.server.count(*CLAIM_GETS)
    answer = await dra_node.kubelet.prepare(GPU, [ref("u1")])
    prepared = answer.claims["u1"]
    assert prepared.error == ""
    assert [d.device_name for d in prepared.devices] == gpus
    assert [list(d.request_names) for d in prepared.devices] == [["gpu-0"], ["gpu-1"]]
    assert list(prepared.devices[0].cdi_device_ids) == [
        f"k8s.{GPU}/claim=u1-gpu-0",
        f"k8s.{GPU}/claim=u1-env",
    ]
    spec = dra_node.spec(GPU, "u1")
    assert spec is not None
    assert spec["cdiVersion"] == "0.5.0"
    assert spec["kind"] == f"k8s.{GPU}/claim"
    uuids = [g["uuid"] for g in node_doc["gpus"][:2]]
    assert env(spec)["NVIDIA_VISIBLE_DEVICES"] == ",".join(uuids)
    gpu0 = next(d for d in spec["devices"] if d["name"] == "u1-gpu-0")
    paths = {n["path"] for n in gpu0["containerEdits"]["deviceNodes"]}
    assert {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"} <= paths

    answer = await dra_node.kubelet.prepare(NIC, [ref("u1")])
    assert answer.claims["u1"].error == ""
    assert [d.device_name for d in answer.claims["u1"].devices] == nics
    nic_env = env(dra_node.spec(NIC, "u1") or {})
    hcas = [dra_node.devices(NIC)[n]["attributes"]["rdmaDevice"]["string"] for n in nics]
    assert sorted(h.split(":")[0] for h in nic_env["NCCL_IB_HCA"].lstrip("=").split(",")) == sorted(
        hcas
    )
    assert len(nic_env["RDMA_NETDEVS"].split(",")) == 2
    assert dra_node.server.count(*CLAIM_GETS) == gets + 2  # one GET per claim and call

    again = await dra_node.kubelet.prepare(GPU, [ref("u1")])
    assert again.claims["u1"] == prepared  # idempotent, from the checkpoint
    assert dra_node.server.count(*CLAIM_GETS) == gets + 2

    for driver in (GPU, NIC):
        for _ in range(2):  # idempotent
            done = await dra_node.kubelet.unprepare(driver, [ref("u1")])
            assert done.claims["u1"].error == ""
        assert dra_node.spec(driver, "u1") is None


async def test_each_bad_claim_gets_its_own_error_and_the_others_are_prepared(
    dra_node: DraNode, node_file: Path
) -> None:
    await dra_node.start(node_file)
    dra_node.claim("good", [("gpu", GPU, "gpu-0")])
    dra_node.claim("unknown", [("gpu", GPU, "gpu-99")])
    dra_node.claim("taken", [("gpu", GPU, "gpu-0")])
    dra_node.claim("admin", [("gpu", GPU, "gpu-0")], adminAccess=True)
    dra_node.claim("config", [("gpu", GPU, "gpu-1")])
    dra_node.server.store.claims["ns", "c-config"]["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "opaque": {"driver": GPU, "parameters": {"kind": "Other"}}}
    ]
    # "missing" is not on the API server; "moved" has another UID there.
    dra_node.claim("other-uid", [("gpu", GPU, "gpu-2")])
    claims = [ref(u) for u in ("good", "unknown", "taken", "admin", "config", "missing")]
    claims.append(("ns", "moved", "c-other-uid"))
    answer = await dra_node.kubelet.prepare(GPU, claims)
    errors = {uid: answer.claims[uid].error for uid in answer.claims}
    assert errors["good"] == ""
    assert errors["admin"] == ""
    assert "gpu-99" in errors["unknown"]
    assert "gpu-0" in errors["taken"] and "c-good" in errors["taken"]
    assert "Other" in errors["config"]
    assert "not found" in errors["missing"]
    assert "moved" in errors["moved"]
    assert dra_node.spec(GPU, "good") is not None
    for failed in ("unknown", "taken", "config", "missing", "moved"):
        assert dra_node.spec(GPU, failed) is None
    # The device a failed claim asked for is free for the next one.
    dra_node.claim("next", [("gpu", GPU, "gpu-1")])
    answer = await dra_node.kubelet.prepare(GPU, [ref("next")])
    assert answer.claims["next"].error == ""


async def _health(node: DraNode, device: str) -> int:
    async for message in node.kubelet.watch_health(GPU):
        states = {d.device.device_name: d.health for d in message.devices}
        if device in states:
            return states[device]
    raise AssertionError("health stream ended")


async def test_an_xid_takes_the_gpu_out_of_its_slice_and_a_reset_brings_it_back(
    dra_node: DraNode, node_file: Path, edit_node: Callable[..., None]
) -> None:
    await dra_node.start(node_file)
    assert await _health(dra_node, "gpu-3") == dra_health_pb2.HEALTHY
    edit_node(lambda d: d["gpus"][3]["xids"].append(79))
    began = time.monotonic()
    await dra_node.wait(lambda: "gpu-3" not in dra_node.devices(GPU), WAIT)
    took = time.monotonic() - began
    print(f"XID 79 -> out of the slice after {took * 1000:.0f} ms")
    assert len(dra_node.devices(GPU)) == 7
    dra_node.claim("late", [("gpu", GPU, "gpu-3")])
    answer = await dra_node.kubelet.prepare(GPU, [ref("late")])
    assert "gpu-3" in answer.claims["late"].error
    assert "Unhealthy" in answer.claims["late"].error
    edit_node(lambda d: d["gpus"][3].__setitem__("lost", True))
    edit_node(lambda d: (d["gpus"][3].__setitem__("lost", False), d["gpus"][3].update(xids=[])))
    await dra_node.wait(lambda: "gpu-3" in dra_node.devices(GPU), WAIT + SHORT.gpu_hold_s)
    answer = await dra_node.kubelet.prepare(GPU, [ref("late")])
    assert answer.claims["late"].error == ""


async def test_with_device_taints_an_unhealthy_gpu_stays_with_a_noschedule_taint(
    dra_node: DraNode, node_file: Path, edit_node: Callable[..., None]
) -> None:
    await dra_node.start(node_file, "--dra-device-taints")
    edit_node(lambda d: d["gpus"][2]["xids"].append(79))

    def taints() -> list[dict[str, Any]]:
        return list(dra_node.devices(GPU).get("gpu-2", {}).get("taints", []))

    await dra_node.wait(taints)
    [taint] = taints()
    assert (taint["key"], taint["value"], taint["effect"]) == (
        f"{GPU}/xid",
        "79",
        "NoSchedule",
    )
    assert len(dra_node.devices(GPU)) == 8


async def test_with_device_taints_a_gpu_taint_follows_its_cause_until_it_is_healthy(
    dra_node: DraNode, node_file: Path, edit_node: Callable[..., None]
) -> None:
    await dra_node.start(node_file, "--dra-device-taints")

    def taints() -> list[tuple[str, str]]:
        device = dra_node.devices(GPU)["gpu-2"]
        return [(t["key"], t.get("value", "")) for t in device.get("taints", [])]

    edit_node(lambda d: d["gpus"][2]["xids"].append(48))
    await dra_node.wait(lambda: taints() == [(f"{GPU}/xid", "48")])
    # Lost while Unhealthy: the kubelet sees no change, the taint does.
    edit_node(lambda d: d["gpus"][2].__setitem__("lost", True))
    await dra_node.wait(lambda: taints() == [(f"{GPU}/gpu-lost", "")])
    edit_node(lambda d: d["gpus"][2].__setitem__("lost", False))  # a reset clears the XID
    await dra_node.wait(lambda: not taints(), WAIT + SHORT.gpu_hold_s)


async def test_slices_the_kubelet_deletes_are_put_back(dra_node: DraNode, node_file: Path) -> None:
    await dra_node.start(node_file)
    dra_node.server.store.delete_node_slices(NODE)
    await dra_node.wait(lambda: len(dra_node.devices(GPU)) == 8 and dra_node.devices(NIC))


async def test_a_restart_keeps_prepared_claims_rewrites_their_specs_and_frees_gone_ones(
    dra_node: DraNode, node_file: Path
) -> None:
    agent = await dra_node.start(node_file)
    dra_node.claim("kept", [("gpu", GPU, "gpu-0")])
    dra_node.claim("gone", [("gpu", GPU, "gpu-1")])
    first = await dra_node.kubelet.prepare(GPU, [ref("kept"), ref("gone")])
    assert {u: c.error for u, c in first.claims.items()} == {"kept": "", "gone": ""}
    assert agent.terminate() == 0
    for spec in dra_node.cdi.iterdir():  # a reboot: the CDI root is a tmpfs
        spec.unlink()
    del dra_node.server.store.claims["ns", "c-gone"]  # its pod ended while we were away
    before = dra_node.server.count(*CLAIM_GETS)

    await dra_node.start(node_file)
    # At start each checkpointed claim is looked up once: "gone" is, "kept" is still there.
    await dra_node.wait(lambda: dra_node.server.count(*CLAIM_GETS) == before + 2)
    await dra_node.wait(lambda: dra_node.spec(GPU, "kept") is not None)
    await dra_node.wait(lambda: dra_node.spec(GPU, "gone") is None)
    gets = dra_node.server.count(*CLAIM_GETS)
    again = await dra_node.kubelet.prepare(GPU, [ref("kept")])
    assert again.claims["kept"] == first.claims["kept"]
    assert dra_node.server.count(*CLAIM_GETS) == gets
    # gpu-0 is still held by "kept"; gpu-1 was freed with "gone".
    dra_node.claim("thief", [("gpu", GPU, "gpu-0")])
    dra_node.claim("heir", [("gpu", GPU, "gpu-1")])

    async def heir_prepared() -> bool:
        answer = await dra_node.kubelet.prepare(GPU, [ref("heir")])
        return not answer.claims["heir"].error

    deadline = time.monotonic() + WAIT
    while not await heir_prepared():
        assert time.monotonic() < deadline, "gpu-1 never freed"
    answer = await dra_node.kubelet.prepare(GPU, [ref("thief")])
    assert "kept" in answer.claims["thief"].error


async def test_devices_running_pods_hold_through_device_plugins_stay_out_until_they_end(
    dra_node: DraNode, node_file: Path, node_doc: dict[str, Any]
) -> None:
    held = node_doc["gpus"][5]["uuid"]
    running = [PodAllocation("old-pod", {"main": AllocatedContainer("main", {RESOURCE: [held]})})]
    lister = PodResourcesServer(dra_node.root / "pod-resources.sock", lambda: running)
    await lister.start()
    try:
        dra_node.start_agent(dra_node.args(node_file), short_timing=True)
        await dra_node.watcher.registered(GPU, WAIT)
        await dra_node.wait(lambda: len(dra_node.devices(GPU)) == 7)
        await dra_node.wait(lambda: lister.calls >= 3)  # asked again while the pod runs
        assert "gpu-5" not in dra_node.devices(GPU)
        dra_node.claim("early", [("gpu", GPU, "gpu-5")])
        answer = await dra_node.kubelet.prepare(GPU, [ref("early")])
        assert "device-plugin" in answer.claims["early"].error
        running.clear()  # the pod is deleted
        await dra_node.wait(lambda: "gpu-5" in dra_node.devices(GPU))
        answer = await dra_node.kubelet.prepare(GPU, [ref("early")])
        assert answer.claims["early"].error == ""
    finally:
        await lister.stop()


async def test_without_pod_resources_the_kubelet_checkpoint_keeps_held_devices_out(
    dra_node: DraNode, node_file: Path, node_doc: dict[str, Any]
) -> None:
    """The checkpoint keeps ended pods' entries until the next device admission: a device
    in it stays out (longer than needed, never handed out twice)."""
    dra_node.device_plugins.mkdir()
    held = node_doc["gpus"][5]["uuid"]
    entry = CheckpointEntry("old-pod", "main", RESOURCE, {0: [held]}, b"")
    write_checkpoint(
        dra_node.device_plugins / CHECKPOINT_NAME, checkpoint_data([entry], {RESOURCE: [held]})
    )
    await dra_node.start(node_file)
    assert sorted(dra_node.devices(GPU)) == sorted(
        f"gpu-{g['minor']}" for g in node_doc["gpus"] if g["uuid"] != held
    )


async def test_dra_mode_without_a_node_name_is_a_usage_error(
    dra_node: DraNode, node_file: Path
) -> None:
    args = [a for a in dra_node.args(node_file) if a not in ("--node-name", NODE)]
    agent = dra_node.start_agent(args)
    assert agent.process.wait(WAIT) == 2
    assert "--node-name" in agent.stderr


async def test_zeros_a_device_plugin_left_in_the_node_status_are_removed(
    dra_node: DraNode, node_file: Path
) -> None:
    """The kubelet keeps a gone plugin's resource at 0 for good; the scheduler then never
    serves `nvidia.com/gpu: 1` through the DeviceClass's extendedResourceName."""
    status = dra_node.server.store.nodes[NODE]["status"]
    left = {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "0", "rdma/roce": "0"}
    other = {"cpu": "2", "example.com/fpga": "0", "nvidia.com/gpu.shared": "4"}
    status["capacity"] = {**left, **other}
    status["allocatable"] = {**left, **other}
    await dra_node.start(node_file)
    node = dra_node.server.store.nodes[NODE]
    await dra_node.wait(lambda: "nvidia.com/gpu" not in node["status"].get("capacity", {}))
    for table in ("capacity", "allocatable"):
        assert dra_node.server.store.nodes[NODE]["status"][table] == other
    # Minutes after a switch, the kubelet gives up on a plugin and writes its zero then.
    late = {"capacity": {"rdma/roce": "0"}, "allocatable": {"rdma/roce": "0"}}
    dra_node.server.store.patch_node_status(NODE, {"status": late}, MERGE)
    node = dra_node.server.store.nodes[NODE]
    await dra_node.wait(lambda: "rdma/roce" not in node["status"]["capacity"])
    assert node["status"]["allocatable"] == other


async def test_without_a_kubelet_the_slices_go_out_after_the_registration_wait(
    dra_node: DraNode, node_file: Path
) -> None:
    """Slices wait for the kubelet to register the drivers (a device it cannot prepare
    yet would hold its pod back a minute), but not for ever: a node whose kubelet never
    answers still publishes."""
    await dra_node.watcher.stop()
    agent = dra_node.start_agent(dra_node.args(node_file))
    await dra_node.wait(lambda: len(dra_node.devices(GPU)) == 8, WAIT + REGISTRATION_WAIT_S)
    assert "dra_slices_before_registration" in agent.stderr
