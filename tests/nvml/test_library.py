"""The test NVML library itself, through pynvml in a subprocess: each check names the
behaviour of NVML's documentation (nvml.h) that it models, so that the suites built on
the library rest on documented behaviour, not on our own guesses."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.nvml.library import nvml_env
from tests.nvml.nodes import from_profile, from_sim_node, with_mig
from tests.nvml.state import NvmlNode

PRELUDE = """
import pynvml as n
def code(call, *args):
    try:
        call(*args)
    except n.NVMLError as exc:
        return exc.value
    return 0
"""


def run(node: NvmlNode, tmp_path: Path, script: str) -> str:
    state = tmp_path / "state"
    node.write(state)
    return run_on(state, script)


def run_on(state: Path, script: str) -> str:
    """`script` (after PRELUDE) in a Python whose pynvml loads the library on `state`."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script)],
        env=nvml_env(state),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_calls_before_init_answer_uninitialized(tmp_path: Path) -> None:
    """nvml.h: NVML_ERROR_UNINITIALIZED "if the library has not been successfully
    initialized"; nvmlInit is counted, each needs its own nvmlShutdown."""
    out = run(
        from_profile("t4"),
        tmp_path,
        """
        n._LoadNvmlLibrary()
        count = n._nvmlGetFunctionPointer("nvmlDeviceGetCount_v2")
        import ctypes
        c = ctypes.c_uint()
        print(count(ctypes.byref(c)))
        n.nvmlInit(); n.nvmlInit(); n.nvmlShutdown()
        print(n.nvmlDeviceGetCount())
        n.nvmlShutdown()
        print(code(n.nvmlShutdown))
        """,
    )
    assert out.split() == ["1", "4", "1"]


def test_init_without_a_node_says_the_driver_is_not_loaded(tmp_path: Path) -> None:
    """nvml.h: nvmlInit answers NVML_ERROR_DRIVER_NOT_LOADED without a running driver."""
    env = nvml_env(tmp_path / "absent")
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + "print(code(n.nvmlInit))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.strip() == "9", done.stderr


def test_a_lost_gpu_answers_gpu_is_lost_and_so_does_a_uuid_search_past_it(
    tmp_path: Path,
) -> None:
    """nvml.h: GPU_IS_LOST "if the target GPU has fallen off the bus"; for
    nvmlDeviceGetHandleByUUID "if any GPU has fallen off the bus" (NVML initializes GPUs
    as it searches): a search that reaches the lost GPU first fails, one that does not
    succeeds. A handle taken before keeps answering for its own GPU."""
    node = from_profile("h100")
    node.gpus[3].lost = True
    out = run(
        node,
        tmp_path,
        f"""
        n.nvmlInit()
        print(n.nvmlDeviceGetCount())
        print(code(n.nvmlDeviceGetHandleByIndex, 3))
        print(code(n.nvmlDeviceGetHandleByUUID, "{node.gpus[1].uuid}"))
        print(code(n.nvmlDeviceGetHandleByUUID, "{node.gpus[5].uuid}"))
        print(code(n.nvmlDeviceGetMemoryInfo, n.nvmlDeviceGetHandleByIndex(5)))
        """,
    )
    assert out.split() == ["8", "15", "0", "15", "0"]


def test_error_answers_apply_to_every_call_or_to_one(tmp_path: Path) -> None:
    """The documented per-call answers NOT_SUPPORTED (3), NO_PERMISSION (4), UNKNOWN (999)."""
    node = from_profile("h100")
    node.gpus[1].error = 4
    node.gpus[2].fails["nvmlDeviceGetTotalEccErrors"] = 999
    node.gpus[3].ecc = False
    out = run(
        node,
        tmp_path,
        """
        n.nvmlInit()
        h = [n.nvmlDeviceGetHandleByIndex(i) for i in (0, 2, 3)]
        ecc = lambda d: n.nvmlDeviceGetTotalEccErrors(d, 1, 0)
        print(code(n.nvmlDeviceGetHandleByIndex, 1))
        print(code(ecc, h[1]), code(n.nvmlDeviceGetMemoryInfo, h[1]))
        print(code(ecc, h[2]), code(ecc, h[0]))
        """,
    )
    assert out.split() == ["4", "999", "0", "3", "0"]


def test_mig_handles_as_nvml_documents_them(tmp_path: Path) -> None:
    """nvml.h MIG API: nvmlDeviceGetMaxMigDeviceCount is 0 "if MIG is not supported or
    enabled"; an empty index answers NOT_FOUND; a MIG handle has GPU and compute instance
    IDs, a MIG- UUID, its own memory, its parent; a GPU handle has no instance IDs."""
    node = with_mig("a100-mixed")
    out = run(
        node,
        tmp_path,
        """
        n.nvmlInit()
        p = n.nvmlDeviceGetHandleByIndex(0)
        print(n.nvmlDeviceGetMaxMigDeviceCount(p), n.nvmlDeviceGetMigMode(p)[0])
        m = n.nvmlDeviceGetMigDeviceHandleByIndex(p, 0)
        print(n.nvmlDeviceIsMigDeviceHandle(m).value, n.nvmlDeviceIsMigDeviceHandle(p).value)
        print(n.nvmlDeviceGetGpuInstanceId(m), n.nvmlDeviceGetComputeInstanceId(m))
        a = n.nvmlDeviceGetAttributes(m)
        print(a.gpuInstanceSliceCount, a.memorySizeMB, n.nvmlDeviceGetMemoryInfo(m).total)
        print(n.nvmlDeviceGetUUID(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)))
        print(n.nvmlDeviceGetUUID(m))
        print(code(n.nvmlDeviceGetMigDeviceHandleByIndex, p, 5))
        print(code(n.nvmlDeviceGetGpuInstanceId, p))
        w = n.nvmlDeviceGetHandleByIndex(5)
        print(n.nvmlDeviceGetMaxMigDeviceCount(w), n.nvmlDeviceGetMigMode(w)[0])
        print(n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByUUID(n.nvmlDeviceGetUUID(m))))
        """,
    )
    first = node.gpus[0].migs[0]
    assert out.splitlines() == [
        "7 1",
        "1 0",
        f"{first.gi} 0",
        f"3 19968 {19968 << 20}",
        node.gpus[0].uuid,
        first.uuid,
        "6",
        "3",
        "0 0",
        first.uuid,
    ]


def test_mig_mode_is_not_supported_where_the_gpu_has_no_mig(tmp_path: Path) -> None:
    out = run(
        from_profile("t4"),
        tmp_path,
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        print(code(n.nvmlDeviceGetMigMode, h), n.nvmlDeviceGetMaxMigDeviceCount(h))
        """,
    )
    assert out.split() == ["3", "0"]


def test_xid_events_reach_registered_sets_once_and_only_after_registration(
    tmp_path: Path,
) -> None:
    """nvmlEventSetWait: TIMEOUT "if no event arrived in specified timeout"; on Linux every
    XID event returns its own data; gpuInstanceId/computeInstanceId are 0xFFFFFFFF for an
    event not attributable to a MIG instance. An event set sees events that occur after
    its registration, each once."""
    node = from_profile("h100")
    node.xid(1, 31)  # before anyone registered: history
    state = tmp_path / "state"
    node.write(state)
    script = f"""
        import os, time
        n.nvmlInit()
        s = n.nvmlEventSetCreate()
        xid = n.nvmlEventTypeXidCriticalError
        for i in range(8):
            n.nvmlDeviceRegisterEvents(n.nvmlDeviceGetHandleByIndex(i), xid, s)
        print(code(n.nvmlEventSetWait_v2, s, 20))
        os.rename("{state}.next", "{state}")
        d = n.nvmlEventSetWait_v2(s, 2000)
        print(n.nvmlDeviceGetUUID(d.device), d.eventData, hex(d.gpuInstanceId))
        print(code(n.nvmlEventSetWait_v2, s, 50))
    """
    node.xid(4, 79)
    (tmp_path / "state.next").write_text(node.render())
    out = run_on(state, script)
    assert out.splitlines() == ["10", f"{node.gpus[4].uuid} 79 0xffffffff", "10"]


def test_nvswitch_links_answer_the_switch_type_and_bus_id(tmp_path: Path) -> None:
    """NVML answers NVML_NVLINK_DEVICE_TYPE_SWITCH (2) and remote bus FFFFFFFF:FF:FF.0
    for a link that ends at an NVSwitch, INVALID_ARGUMENT (2) for an index past the GPU's
    links (an H100 has 18); a GPU without NVLink answers NOT_SUPPORTED."""
    out = run(
        from_profile("h100"),
        tmp_path,
        """
        n.nvmlInit()
        h = n.nvmlDeviceGetHandleByIndex(0)
        print(n.nvmlDeviceGetNvLinkState(h, 17), code(n.nvmlDeviceGetNvLinkState, h, 18))
        print(n.nvmlDeviceGetNvLinkRemoteDeviceType(h, 0))
        print(n.nvmlDeviceGetNvLinkRemotePciInfo(h, 0).busId)
        """,
    )
    assert out.split() == ["1", "2", "2", "FFFFFFFF:FF:FF.0"]
    out = run(
        from_profile("l40s"),
        tmp_path,
        "n.nvmlInit(); print(code(n.nvmlDeviceGetNvLinkState, n.nvmlDeviceGetHandleByIndex(0), 0))",
    )
    assert out.split() == ["3"]


@pytest.mark.parametrize("name", ["mig-mixed", "h100-8gpu-8nic"])
def test_a_simulated_node_file_reads_as_the_same_gpus(name: str, tmp_path: Path) -> None:
    from agents.sim.bundled import bundled_node
    from agents.sim.node import load_node

    spec = load_node(bundled_node(name))
    node = from_sim_node(spec)
    out = run(
        node,
        tmp_path,
        """
        n.nvmlInit()
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            migs = []
            if n.nvmlDeviceGetMaxMigDeviceCount(h):
                for s in range(7):
                    try:
                        m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, s)
                        migs.append(n.nvmlDeviceGetUUID(m))
                    except n.NVMLError:
                        pass
            print(n.nvmlDeviceGetUUID(h), n.nvmlDeviceGetPciInfo(h).busId, *migs)
        """,
    )
    want = [
        " ".join([g.uuid, f"0000{g.pci.upper()}", *(m.uuid for m in g.mig_instances)])
        for g in spec.gpus
    ]
    assert out.splitlines() == want
