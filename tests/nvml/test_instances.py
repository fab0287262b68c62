"""The test NVML library's PCIe topology and MIG GPU/compute instances, through pynvml in a
subprocess: each check names the nvml.h behaviour it models."""

from __future__ import annotations

from pathlib import Path

from tests.nvml.nodes import from_profile, from_sim_node, with_mig
from tests.nvml.test_library import run

# nvml.h's values.
INTERNAL, HOSTBRIDGE, NODE, SYSTEM = 0, 30, 40, 50
INVALID_ARGUMENT, NOT_SUPPORTED, NOT_FOUND = 2, 3, 6


def test_common_ancestor_follows_the_host_bridges_and_numa_nodes(tmp_path: Path) -> None:
    """nvmlDeviceGetTopologyCommonAncestor: HOSTBRIDGE "connected to the same host bridge",
    NODE "same NUMA node but possibly multiple host bridges", SYSTEM "all devices in the
    system"; INVALID_ARGUMENT "if device1, or device2 is invalid, or pathInfo is NULL".
    The h100 profile has GPUs 0-3 under pci0000:00 (NUMA 0), 4-7 under pci0000:80."""
    out = run(
        from_profile("h100"),
        tmp_path,
        """
        import ctypes
        n.nvmlInit()
        h = [n.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
        top = n.nvmlDeviceGetTopologyCommonAncestor
        print(top(h[0], h[3]), top(h[4], h[7]), top(h[0], h[4]), top(h[2], h[2]))
        fn = n._nvmlGetFunctionPointer("nvmlDeviceGetTopologyCommonAncestor")
        print(fn(h[0], h[1], None), fn(h[0], ctypes.c_void_p(8), ctypes.byref(ctypes.c_uint())))
        """,
    )
    assert out.splitlines() == [
        f"{HOSTBRIDGE} {HOSTBRIDGE} {SYSTEM} {INTERNAL}",
        f"{INVALID_ARGUMENT} {INVALID_ARGUMENT}",
    ]


def test_common_ancestor_on_a_node_file_knows_only_numa_nodes(tmp_path: Path) -> None:
    """Without host bridges the nearest vouched-for level is NODE (same NUMA node), else
    SYSTEM, which holds for any two GPUs."""
    from agents.sim.bundled import bundled_node
    from agents.sim.node import load_node

    spec = load_node(bundled_node("h100-8gpu-8nic"))
    node = from_sim_node(spec)
    out = run(
        node,
        tmp_path,
        """
        n.nvmlInit()
        h = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
        print(*(n.nvmlDeviceGetTopologyCommonAncestor(h[0], d) for d in h[1:]))
        """,
    )
    numa = [g.numa for g in spec.gpus]
    want = [NODE if x is not None and x == numa[0] else SYSTEM for x in numa[1:]]
    assert out.split() == [str(w) for w in want]


def test_gpu_instance_profile_info_enumerates_until_invalid_argument(tmp_path: Path) -> None:
    """nvmlDeviceGetGpuInstanceProfileInfo: enumerating profiles "starting from 0, until the
    API returns NVML_ERROR_INVALID_ARGUMENT"; NOT_SUPPORTED "If device doesn't support MIG
    or profile isn't supported". Each profile's memory is that of its instances."""
    out = run(
        with_mig("a100-mixed"),
        tmp_path,
        """
        n.nvmlInit()
        a100, t = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(4)
        info = lambda d, p: n.nvmlDeviceGetGpuInstanceProfileInfo(d, p, version=1)
        for p in range(5):
            i = info(a100, p)
            print(i.id, i.sliceCount, i.instanceCount, i.memorySizeMB)
        print(*(code(info, a100, p) for p in (5, 6, 7, n.NVML_GPU_INSTANCE_PROFILE_COUNT)))
        print(info(t, 0).id, code(info, n.nvmlDeviceGetMigDeviceHandleByIndex(a100, 0), 0))
        """,
    )
    assert out.splitlines() == [
        "19 1 7 4864",
        "14 2 3 9984",
        "9 3 2 19968",
        "5 4 1 19968",
        "0 7 1 40192",
        f"{NOT_SUPPORTED} {NOT_SUPPORTED} 0 {INVALID_ARGUMENT}",
        f"19 {NOT_SUPPORTED}",
    ]
    out = run(
        from_profile("t4"),
        tmp_path,
        """
        n.nvmlInit()
        d = n.nvmlDeviceGetHandleByIndex(0)
        print(code(n.nvmlDeviceGetGpuInstanceProfileInfo, d, 0, 1))
        """,
    )
    assert out.split() == [str(NOT_SUPPORTED)]


def test_gpu_instance_by_id(tmp_path: Path) -> None:
    """nvmlDeviceGetGpuInstanceById: NOT_SUPPORTED "If device doesn't have MIG mode
    enabled", NOT_FOUND "If the GPU instance is not found"."""
    node = with_mig("a100-mixed")
    out = run(
        node,
        tmp_path,
        """
        n.nvmlInit()
        p, whole = n.nvmlDeviceGetHandleByIndex(0), n.nvmlDeviceGetHandleByIndex(5)
        print(n.nvmlGpuInstanceGetInfo(n.nvmlDeviceGetGpuInstanceById(p, 3)).id)
        print(code(n.nvmlDeviceGetGpuInstanceById, p, 2))
        print(code(n.nvmlDeviceGetGpuInstanceById, whole, 0))
        """,
    )
    assert [m.gi for m in node.gpus[0].migs] == [1, 3, 7, 8]
    assert out.split() == ["3", str(NOT_FOUND), str(NOT_SUPPORTED)]


def test_gpu_instance_info_is_its_mig_device(tmp_path: Path) -> None:
    """nvmlGpuInstanceGetInfo: the parent device, the instance ID the MIG device reports,
    its profile's ID, its placement; INVALID_ARGUMENT once the instance is gone."""
    node = with_mig("a100-mixed")
    state = tmp_path / "state"
    gone = with_mig("a100-mixed")
    gone.gpus[0].mig, gone.gpus[0].migs = False, []
    (tmp_path / "state.next").write_text(gone.render())
    out = run(
        node,
        tmp_path,
        f"""
        import os
        n.nvmlInit()
        p = n.nvmlDeviceGetHandleByIndex(0)
        for s in range(4):
            m = n.nvmlDeviceGetMigDeviceHandleByIndex(p, s)
            i = n.nvmlGpuInstanceGetInfo(
                n.nvmlDeviceGetGpuInstanceById(p, n.nvmlDeviceGetGpuInstanceId(m))
            )
            print(n.nvmlDeviceGetUUID(i.device), i.id, i.profileId, i.placement.start,
                  i.placement.size)
        gi = n.nvmlDeviceGetGpuInstanceById(p, 1)
        os.rename("{state}.next", "{state}")
        print(code(n.nvmlGpuInstanceGetInfo, gi))
        """,
    )
    parent = node.gpus[0].uuid
    assert out.splitlines() == [
        f"{parent} 1 9 4 4",  # 3g.20gb: profile ID 9, the upper half of the memory
        f"{parent} 3 14 0 2",
        f"{parent} 7 19 2 1",
        f"{parent} 8 19 3 1",
        str(INVALID_ARGUMENT),
    ]


def test_compute_instance_profile_info_within_the_gpu_instance(tmp_path: Path) -> None:
    """nvmlGpuInstanceGetComputeInstanceProfileInfo: INVALID_ARGUMENT for an invalid
    profile or engProfile, NOT_SUPPORTED "If profile isn't supported" (here: wider than the
    GPU instance)."""
    out = run(
        with_mig("a100-mixed"),
        tmp_path,
        """
        n.nvmlInit()
        gi = n.nvmlDeviceGetGpuInstanceById(n.nvmlDeviceGetHandleByIndex(0), 1)  # 3g
        info = lambda p, e: n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, p, e, 1)
        for p in range(3):
            i = info(p, 0)
            print(i.id, i.sliceCount, i.instanceCount, i.multiprocessorCount)
        print(code(info, 3, 0), code(info, 4, 0), code(info, 9, 0), code(info, 0, 1))
        """,
    )
    assert out.splitlines() == [
        "0 1 3 14",
        "1 2 1 28",
        "2 3 1 42",
        f"{NOT_SUPPORTED} {NOT_SUPPORTED} {INVALID_ARGUMENT} {INVALID_ARGUMENT}",
    ]


def test_compute_instance_by_id_and_its_info(tmp_path: Path) -> None:
    """nvmlGpuInstanceGetComputeInstanceById: NOT_FOUND "If the compute instance is not
    found"; nvmlComputeInstanceGetInfo: parent device, parent GPU instance, the ID the MIG
    device reports, its profile ID, placement within the GPU instance's compute slices."""
    node = with_mig("h100-uniform")
    out = run(
        node,
        tmp_path,
        """
        n.nvmlInit()
        p = n.nvmlDeviceGetHandleByIndex(6)
        m = n.nvmlDeviceGetMigDeviceHandleByIndex(p, 2)
        gi = n.nvmlDeviceGetGpuInstanceById(p, n.nvmlDeviceGetGpuInstanceId(m))
        ci = n.nvmlGpuInstanceGetComputeInstanceById(gi, n.nvmlDeviceGetComputeInstanceId(m))
        for get in (n.nvmlComputeInstanceGetInfo, n.nvmlComputeInstanceGetInfo_v2):
            i = get(ci)
            print(n.nvmlDeviceGetUUID(i.device), n.nvmlGpuInstanceGetInfo(i.gpuInstance).id,
                  i.id, i.profileId, i.placement.start, i.placement.size)
        print(code(n.nvmlGpuInstanceGetComputeInstanceById, gi, 1))
        """,
    )
    mig = node.gpus[6].migs[2]
    line = f"{node.gpus[6].uuid} {mig.gi} 0 0 0 1"
    assert out.splitlines() == [line, line, str(NOT_FOUND)]
