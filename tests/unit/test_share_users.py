"""Which pods of shares wait behind another Linux user's MPS server, read from a /proc in a
temporary directory: MPS clients of another user only, none while no server runs."""

from __future__ import annotations

from pathlib import Path

from agents.hw.procfs import Procfs
from agents.share_users import Waiting, waiting

POD_A = "3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b"
POD_B = "9e8d7c6b-5a49-4837-a261-504f3e2d1c0b"
CLIENT = b"CUDA_MPS_PIPE_DIRECTORY=/mps/gpu.nvidia.com/pipe\0PATH=/bin\0"


def process(proc: Path, pid: int, uid: int, pod: str | None, environ: bytes = CLIENT) -> None:
    where = proc / str(pid)
    where.mkdir(parents=True)
    cgroup = f"0::/kubepods/besteffort/pod{pod}/\n" if pod else "0::/system.slice/x\n"
    (where / "cgroup").write_text(cgroup)
    (where / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (where / "environ").write_bytes(environ)


def test_only_mps_clients_of_another_user_in_a_shares_pod_wait(tmp_path: Path) -> None:
    process(tmp_path, 1, 1000, None)  # the server
    process(tmp_path, 10, 1000, POD_A)  # its user's client: served
    process(tmp_path, 20, 2000, POD_B)  # another user's client: waits
    process(tmp_path, 21, 2000, POD_B)  # the same pod again: one entry
    process(tmp_path, 22, 65535, POD_B, b"PATH=/\0")  # the pod's pause: no client
    process(tmp_path, 30, 3000, "0e8d7c6b-5a49-4837-a261-504f3e2d1c0b")  # not a share's
    (tmp_path / "self").mkdir()
    procfs = Procfs(tmp_path)
    assert waiting([1], procfs, {POD_A, POD_B}) == [Waiting(POD_B, 2000, 1000)]
    assert waiting([], procfs, {POD_A, POD_B}) == []  # no server: the next gets one
    assert waiting([99], procfs, {POD_B}) == []  # a server that has ended
