"""The simulator's twin of the driver's `nvidia-cuda-mps-control`, run as a program: `-d`
starts a detached daemon for $CUDA_MPS_PIPE_DIRECTORY; without arguments one command is
read from stdin and sent to it. The daemon answers as the driver's does and records
every command in $CUDA_MPS_LOG_DIRECTORY/control.log. Unlike the driver's, a daemon ends
when its socket is removed (the simulated node's tree taken away) or when it has been asked
nothing for IDLE_S (an agent asks at every probe), so that tests leave none behind."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

SOCKET = "control"  # in the pipe directory, reached relative to it (paths may be long)
PID_FILE = "nvidia-cuda-mps-control.pid"
LOG_FILE = "control.log"
SERVERS = "servers"  # in the pipe directory: the server PIDs get_server_list answers
CLIENTS = "clients-"  # + a server PID, in the pipe directory: get_client_list's answer
START_WAIT_S = 5.0
GONE_CHECK_S = 1.0  # how often a daemon looks for its socket: gone with the node's tree, it ends
IDLE_S = 120.0  # a daemon asked nothing this long ends: its agent is gone (killed, say)


def install_twin(root: Path) -> Path:
    """Put the twin where the driver's program would be under `root`; its path."""
    program = root / "usr" / "bin" / "nvidia-cuda-mps-control"
    program.parent.mkdir(parents=True, exist_ok=True)
    program.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m agents.sim.mps_control "$@"\n')
    program.chmod(0o755)
    return program


def main(argv: list[str]) -> int:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    log = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
    if argv == ["-d"]:
        return _daemonise(pipe, log)
    if argv == ["--serve"]:
        return _serve(pipe, log)
    try:
        print(_ask(pipe, sys.stdin.read().strip()))
    except OSError:
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    return 0


def _ask(pipe: Path, command: str) -> str:
    with socket.socket(socket.AF_UNIX) as conn:
        os.chdir(pipe)
        conn.connect(SOCKET)
        conn.sendall(command.encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)
        return _received(conn)


def _daemonise(pipe: Path, log: Path) -> int:
    with contextlib.suppress(OSError):
        _ask(pipe, "get_server_list")
        print("An instance of this daemon is already running", file=sys.stderr)
        return 1
    pipe.mkdir(parents=True, exist_ok=True)
    log.mkdir(parents=True, exist_ok=True)
    subprocess.Popen(
        [sys.executable, "-m", "agents.sim.mps_control", "--serve"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:  # a start waits for its socket, as -d does
        with contextlib.suppress(OSError):
            _ask(pipe, "get_server_list")
            return 0
        time.sleep(0.01)
    return 1


def _serve(pipe: Path, log: Path) -> int:
    os.chdir(pipe)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SOCKET)
    state = {"threads": "100.0"}
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(SOCKET)
        server.listen()
        server.settimeout(GONE_CHECK_S)
        mine = os.stat(SOCKET).st_ino
        (pipe / PID_FILE).write_text(f"{os.getpid()}\n")
        asked = time.monotonic()
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                if not _there(Path(SOCKET), mine) or time.monotonic() - asked > IDLE_S:
                    return 0
                continue
            asked = time.monotonic()
            conn.settimeout(None)
            with conn:
                command = _received(conn)
                with (log / LOG_FILE).open("a") as out:
                    out.write(command + "\n")
                conn.sendall(_answer(command, state).encode())
            if command == "quit":
                os.unlink(SOCKET)
                return 0


def _there(path: Path, inode: int) -> bool:
    try:
        return path.stat().st_ino == inode
    except OSError:
        return False


def _received(conn: socket.socket) -> str:
    chunks = []
    while chunk := conn.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks).decode().strip()


def _answer(command: str, state: dict[str, str]) -> str:
    words = command.split()
    if words[:1] == ["set_default_active_thread_percentage"] and len(words) == 2:
        state["threads"] = f"{float(words[1]):.1f}"
        return state["threads"]
    if words[:1] == ["get_default_active_thread_percentage"]:
        return state["threads"]
    if words[:1] == ["get_server_list"]:  # the servers a test says run (cwd: the pipe dir)
        with contextlib.suppress(OSError):
            return Path(SERVERS).read_text().strip()
    if words[:1] == ["get_client_list"] and len(words) == 2:  # the clients a test says
        with contextlib.suppress(OSError):
            return Path(CLIENTS + words[1]).read_text().strip()
    return ""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
