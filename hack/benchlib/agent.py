"""A `node-agent run --simulate` subprocess and a blocking gRPC client for its sockets."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from queue import Empty, Queue
from typing import Any

import grpc
import yaml

from agents.api import api_pb2 as pb
from agents.api import api_pb2_grpc as pb_grpc
from agents.plugin.server import socket_name

GPU = "nvidia.com/gpu"
NIC = "rdma/roce"


def node_agent_command() -> list[str]:
    """The installed console script next to this interpreter, else the module itself."""
    script = Path(sys.executable).parent / "node-agent"
    if script.exists():
        return [str(script)]
    found = shutil.which("node-agent")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from agents.cli import main; sys.exit(main())"]


class AgentProcess:
    """One agent process on a simulated node; logs go to `<work>/agent.log`."""

    def __init__(
        self,
        work: Path,
        node_file: Path,
        *,
        config: dict[str, Any] | None = None,
        prefix: Sequence[str] = (),
        extra: Sequence[str] = (),
    ) -> None:
        self.work = work
        self.extra = list(extra)  # more flags of `node-agent run`
        self.plugin_dir = work / "device-plugins"
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.node_file = node_file
        self.config_file: Path | None = None
        if config is not None:
            self.config_file = work / "config.yaml"
            self.config_file.write_text(yaml.safe_dump(config))
        self.prefix = list(prefix)
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    def command(self) -> list[str]:
        cmd = [*self.prefix, *node_agent_command(), "run", "--simulate", str(self.node_file)]
        cmd += ["--device-plugin-dir", str(self.plugin_dir), "--log-format", "json"]
        if self.config_file is not None:
            cmd += ["--config", str(self.config_file)]
        return cmd + self.extra

    def start(self) -> None:
        log = (self.work / "agent.log").open("ab")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=log, stdin=subprocess.DEVNULL
        )
        log.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def socket(self, resource: str) -> Path:
        return self.plugin_dir / socket_name(resource)

    def wait_serving(self, resources: Sequence[str], within: float = 30.0) -> None:
        """Until every resource's socket answers GetDevicePluginOptions."""
        deadline = time.monotonic() + within
        for resource in resources:
            while not self.socket(resource).exists():
                self._check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no socket for {resource} after {within}s")
                time.sleep(0.01)
            with Client(self.socket(resource)) as client:
                client.options(timeout=max(deadline - time.monotonic(), 0.1))

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = (self.work / "agent.log").read_text()[-2000:]
            raise RuntimeError(f"agent exited with {self.proc.returncode}:\n{tail}")

    def stop(self, sig: int = signal.SIGTERM, within: float = 10.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(within)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.pid)

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def thread_count(self) -> int:
        return len(proc_thread_ids(self.pid))


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process so far, in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    # utime and stime are fields 14 and 15 of the whole line, in clock ticks.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_cpu_reading(pid: int) -> tuple[float, dict[int, int]]:
    """The process's CPU time so far: utime + stime in seconds (10 ms ticks), and each
    thread's time on a CPU in ns (its schedstat)."""
    threads: dict[int, int] = {}
    for tid in proc_thread_ids(pid):
        try:
            threads[tid] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):  # it ended meanwhile: the ticks count it
            continue
    return proc_cpu_seconds(pid), threads


def cpu_seconds_between(
    before: tuple[float, dict[int, int]], after: tuple[float, dict[int, int]]
) -> float:
    """CPU seconds spent between two proc_cpu_reading()s: to the ns where the same threads
    ran throughout (an idle process starts none), else in ticks, which count every thread.
    A thread that came and went between the two is seen by the ticks alone: when they
    count more than two ticks beyond the threads' sum, the ticks are the answer."""
    ticks = after[0] - before[0]
    if before[1].keys() != after[1].keys():
        return ticks
    precise = sum(after[1][t] - before[1][t] for t in after[1]) / 1e9
    return ticks if ticks - precise > 2 / os.sysconf("SC_CLK_TCK") else precise


def proc_thread_ids(pid: int) -> set[int]:
    """The IDs of a process's threads now: a thread started later has a new one."""
    return {int(tid) for tid in os.listdir(f"/proc/{pid}/task")}


class Client:
    """Blocking DevicePlugin client on one plugin socket, as the kubelet dials it."""

    def __init__(self, socket: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.close()

    def options(self, timeout: float = 5.0) -> Any:
        return self.stub.GetDevicePluginOptions(pb.Empty(), timeout=timeout, wait_for_ready=True)

    def devices(self, timeout: float = 5.0) -> dict[str, str]:
        """The first ListAndWatch message: device ID -> health."""
        stream = self.stub.ListAndWatch(pb.Empty(), timeout=timeout)
        try:
            first = next(iter(stream))
        finally:
            stream.cancel()
        return {d.ID: d.health for d in first.devices}

    def allocate(self, ids: Sequence[str], timeout: float = 5.0) -> Any:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devicesIDs=list(ids))]
        )
        return self.stub.Allocate(request, timeout=timeout)

    def preferred(
        self, available: Sequence[str], must: Sequence[str], size: int, timeout: float = 5.0
    ) -> list[str]:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must),
                    allocation_size=size,
                )
            ]
        )
        answer = self.stub.GetPreferredAllocation(request, timeout=timeout)
        return list(answer.container_responses[0].deviceIDs)


class Watcher:
    """A ListAndWatch stream read on a thread; each message timestamped on arrival."""

    def __init__(self, socket: Path) -> None:
        self._client = Client(socket)
        self._stream = self._client.stub.ListAndWatch(pb.Empty())
        self.messages: Queue[tuple[float, dict[str, str]]] = Queue()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for message in self._stream:
                health = {d.ID: d.health for d in message.devices}
                self.messages.put((time.monotonic(), health))
        except grpc.RpcError:
            return

    def wait_for(self, condition: Callable[[dict[str, str]], bool], within: float) -> float:
        """The arrival time of the first message from now on that meets `condition`."""
        deadline = time.monotonic() + within
        while True:
            try:
                at, health = self.messages.get(timeout=max(deadline - time.monotonic(), 0.0))
            except Empty:
                raise TimeoutError(f"no matching ListAndWatch message in {within}s") from None
            if condition(health):
                return at

    def close(self) -> None:
        self._stream.cancel()
        self._client.channel.close()
        self._thread.join(5)


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def timed_each(calls: Sequence[Callable[[], object]]) -> Iterator[float]:
    """The duration of each call, in seconds; whatever built them is not timed."""
    for call in calls:
        started = time.perf_counter()
        call()
        yield time.perf_counter() - started


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """This process stands for the kubelet (its client, its pod-resources server), whose
    collector runs beside it: a full collection of the bench's own heap while it times a
    call (about 10 ms) would be charged to the agent's answer."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()
