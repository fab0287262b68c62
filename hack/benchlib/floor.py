"""The agent beside the Python floor: a no-op grpc.aio device plugin (noop_plugin.py), the
agent on a simulated node and, where NVIDIA's mock NVML is given, the agent on the real
NVML backend (pynvml) over it, H100 and L40S profiles; NVIDIA's own plugin over the same
mock where its binary is given. Every one is a subprocess measured from outside, under
the same kubelet stand-in, with the same client and the same figures, in one run.

MOCK_NVML_DIR: a directory holding NVIDIA's mock libnvidia-ml.so.1 and its profiles
(MOCK_NVML_PROFILES, else <dir>/profiles or <dir>/configs). NVIDIA_DEVICE_PLUGIN: the
path of NVIDIA's `nvidia-device-plugin` binary. Without them those columns are skipped."""

from __future__ import annotations

import asyncio
import compileall
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from agents.standin.kubelet import Kubelet
from hack.benchlib.agent import (
    GPU,
    Client,
    cpu_seconds_between,
    node_agent_command,
    percentile,
    proc_cpu_reading,
    timed_each,
)
from hack.benchlib.figures import Figure, markdown
from hack.benchlib.nodes import generate_node, write_yaml

REPO = Path(__file__).resolve().parents[2]
PROFILES = ("h100", "l40s")
ALLOCATE_RATIO = 1.1  # agent's Allocate p50 at most this times the floor's
RSS_EXTRA_MB = 10.0  # agent's RSS at most the floor's plus this
REGISTER_S = 0.25  # start -> registered with the kubelet, devices listed
XID_S = 0.3  # XID 79 -> Unhealthy in the kubelet's stream, every run
IDLE_EXTRA_POINTS = 0.1  # idle CPU at most NVIDIA's plugin's plus this
NVIDIA_IDLE_PCT = 0.3  # NVIDIA's plugin's idle CPU as last measured, where it is not run
MOCK_TTL_MS = 100  # how often the mock re-reads its overrides file
# Start-up work ends before the idle window opens: the agent's last is its heap frozen a
# second after it started (a full collection, ~11 ms), which is no idle cost.
SETTLE_S = 3.0
WITHIN_S = 5.0
WARMUP = 50
BLOCK = 50  # Allocate calls to one process before the other's turn


@dataclass
class Subject:
    """One process to measure: how it is started and how an XID is made on its node."""

    label: str
    command: list[str]
    env: dict[str, str]
    devices: int
    xid: Callable[[int], str] | None = None  # fault GPU i; the device ID that must turn
    cwd: Path = REPO


@dataclass
class Measured:
    register_s: float | None = None
    rss_mb: float | None = None
    idle_pct: float | None = None
    allocate_ms: float | None = None
    floor_allocate_ms: float | None = None  # the floor's, timed in turn with these calls
    xid_s: list[float] = field(default_factory=list)
    error: str = ""


def mock_dir() -> Path | None:
    given = os.environ.get("MOCK_NVML_DIR")
    return Path(given) if given else None


def mock_profiles(lib: Path) -> Path:
    given = os.environ.get("MOCK_NVML_PROFILES")
    if given:
        return Path(given)
    return lib / "profiles" if (lib / "profiles").is_dir() else lib / "configs"


def _noop(plugin_dir: Path, ids: Sequence[str]) -> Subject:
    command = [sys.executable, "-m", "hack.benchlib.noop_plugin"]
    command += ["--device-plugin-dir", str(plugin_dir), "--resource", GPU]
    return Subject("floor (no-op plugin)", [*command, "--devices", ",".join(ids)], {}, len(ids))


def _sim_agent(work: Path, plugin_dir: Path) -> Subject:
    doc = generate_node(8, 0)
    node = write_yaml(work / "node.yaml", doc)

    def xid(i: int) -> str:
        doc["gpus"][i]["xids"] = [79]
        write_yaml(node, doc)  # an atomic rename, watched by inotify
        return str(doc["gpus"][i]["uuid"])

    command = [*node_agent_command(), "run", "--simulate", str(node), "--families", "gpu"]
    command += ["--device-plugin-dir", str(plugin_dir), *_own_kubelet(work), "--log-format", "json"]
    return Subject("agent (simulated node)", command, {}, 8, xid)


def _own_kubelet(work: Path) -> list[str]:
    """The rest of the kubelet's paths, in the run's own directory as the plugin directory
    is: what the machine's kubelet left (a DRA checkpoint of an earlier run, a
    pod-resources socket) would otherwise be read at the agent's start."""
    out = ["--kubelet-plugins-dir", str(work / "kubelet-plugins"), "--cdi-root", str(work / "cdi")]
    out += ["--pod-resources-socket", str(work / "pod-resources.sock")]
    return out


def _mock_env(lib: Path, profile: str, overrides: Path) -> dict[str, str]:
    return {
        "LD_LIBRARY_PATH": str(lib),
        "MOCK_NVML_CONFIG": str(mock_profiles(lib) / f"mock-nvml-config-{profile}.yaml"),
        "MOCK_NVML_OVERRIDES": str(overrides),
        "MOCK_NVML_OVERRIDES_TTL": f"{MOCK_TTL_MS}ms",
    }


def _mock_uuids(lib: Path, profile: str) -> list[str]:
    doc: dict[str, Any] = yaml.safe_load(
        (mock_profiles(lib) / f"mock-nvml-config-{profile}.yaml").read_text()
    )
    return [str(d["uuid"]) for d in sorted(doc["devices"], key=lambda d: int(d["index"]))]


def _mock_agent(work: Path, plugin_dir: Path, lib: Path, profile: str) -> Subject:
    overrides = work / f"overrides-{profile}.yaml"
    overrides.write_text("devices: {}\n")
    uuids = _mock_uuids(lib, profile)
    failing: dict[str, object] = {}

    def xid(i: int) -> str:
        # The mock trips a GPU at its next device call once it reads this file: XID 79
        # in the event set, then GPU_IS_LOST from every call.
        failing[str(i)] = {"failure": {"mode": "fallen_off_bus", "xid": {"code": 79}}}
        tmp = overrides.with_name(overrides.name + ".tmp")
        tmp.write_text(yaml.safe_dump({"devices": failing}))
        tmp.replace(overrides)
        return uuids[i]

    command = [*node_agent_command(), "run", "--families", "gpu"]
    command += ["--device-plugin-dir", str(plugin_dir), *_own_kubelet(work), "--log-format", "json"]
    env = _mock_env(lib, profile, overrides)
    return Subject(f"agent ({profile}, mock NVML)", command, env, len(uuids), xid)


def _nvidia(plugin_dir: Path, lib: Path, binary: Path, work: Path) -> Subject:
    """NVIDIA's plugin serves under /var/lib/kubelet/device-plugins whatever its kubelet
    socket: it runs in a mount namespace of its own where the stand-in's directory is
    mounted there, so a kubelet of this machine never sees it."""
    overrides = work / "overrides-nvidia.yaml"
    overrides.write_text("devices: {}\n")
    fixed = "/var/lib/kubelet/device-plugins"
    script = f'mkdir -p {fixed} && mount --bind "$0" {fixed} && '
    script += f'exec "$1" --kubelet-socket {fixed}/kubelet.sock'
    command = ["unshare", "-m", "--propagation", "private", "sh", "-c", script]
    command += [str(plugin_dir), str(binary)]
    env = _mock_env(lib, "h100", overrides)
    return Subject("NVIDIA's plugin (h100, mock NVML)", command, env, len(_mock_uuids(lib, "h100")))


def _registered(kubelet: Kubelet, devices: int) -> bool:
    view = kubelet.resource(GPU)
    return view is not None and view.connected and len(view.devices) >= devices


def _health(kubelet: Kubelet) -> dict[str, str]:
    view = kubelet.resource(GPU)
    if view is None or not view.connected:
        return {}
    return {i: s.health for i, s in view.devices.items()}


def _unhealthy(kubelet: Kubelet, *, device: str) -> bool:
    return _health(kubelet).get(device) == "Unhealthy"


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _socket(plugin_dir: Path) -> Path:
    """The plugin's own socket: the one that is not the kubelet's."""
    found = [p for p in plugin_dir.glob("*.sock") if p.name != "kubelet.sock"]
    if len(found) != 1:
        raise RuntimeError(f"expected one plugin socket in {plugin_dir}, found {found}")
    return found[0]


def _allocate_p50(
    socket: Path, ids: Sequence[str], n: int, floor: tuple[Path, Sequence[str]] | None = None
) -> tuple[float, float | None]:
    """Allocate p50 in ms; with the floor's socket and IDs, the floor's too, its calls
    taken in turn with these in blocks of BLOCK, so that both see the same machine."""
    rng = random.Random(1)
    with Client(socket) as client, Client(floor[0] if floor else socket) as other:
        other_ids = floor[1] if floor else ids
        for _ in range(WARMUP):
            client.allocate([rng.choice(ids)])
            other.allocate([rng.choice(other_ids)])
        own: list[float] = []
        theirs: list[float] = []
        for start in range(0, n, BLOCK):
            size = min(BLOCK, n - start)
            calls = [partial(client.allocate, [rng.choice(ids)]) for _ in range(size)]
            own += [s * 1000 for s in timed_each(calls)]
            if floor is not None:
                calls = [partial(other.allocate, [rng.choice(other_ids)]) for _ in range(size)]
                theirs += [s * 1000 for s in timed_each(calls)]
        return percentile(own, 50), percentile(theirs, 50) if theirs else None


def _spawn(subject: Subject, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as sink:
        return subprocess.Popen(
            subject.command,
            env={**os.environ, **subject.env},
            cwd=subject.cwd,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
        )


def _nvidia_binary() -> Path | None:
    given = os.environ.get("NVIDIA_DEVICE_PLUGIN")
    return Path(given) if given and Path(given).exists() else None


async def measure(
    subject: Subject,
    plugin_dir: Path,
    log: Path,
    *,
    idle_s: float,
    calls: int,
    xids: int,
    floor: tuple[Path, Sequence[str]] | None = None,
) -> Measured:
    out = Measured()
    kubelet = Kubelet(plugin_dir, seed=1)
    await kubelet.start()
    started = time.monotonic()
    proc = _spawn(subject, log)
    try:
        await kubelet.wait_until(lambda k: _registered(k, subject.devices), 30)
        out.register_s = time.monotonic() - started
        await asyncio.sleep(SETTLE_S)
        cpu, began = proc_cpu_reading(proc.pid), time.monotonic()
        await asyncio.sleep(idle_s)  # the window itself
        spent = cpu_seconds_between(cpu, proc_cpu_reading(proc.pid))
        out.idle_pct = spent / (time.monotonic() - began) * 100
        ids = sorted(_health(kubelet))
        # Blocking calls on the loop's thread: the stand-in waits meanwhile, as it is idle.
        out.allocate_ms, out.floor_allocate_ms = _allocate_p50(
            _socket(plugin_dir), ids, calls, floor
        )
        out.rss_mb = _rss_mb(proc.pid)
        if subject.xid is not None:
            for i in range(xids):
                at = time.monotonic()
                device = subject.xid(i)
                await kubelet.wait_until(partial(_unhealthy, device=device), WITHIN_S)
                out.xid_s.append(time.monotonic() - at)
    except (TimeoutError, RuntimeError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        await kubelet.stop()
    return out


def compile_sources() -> None:
    """Bytecode for the agent and the floor, as an installed package has it (the image
    compiles at install): without it every start compiles ~90 modules of the agent's own,
    which costs start-up time and memory that no deployed agent pays."""
    for package in ("agents", "hack/benchlib"):
        compileall.compile_dir(REPO / package, quiet=1)


def subjects(work: Path, plugin_dir: Path) -> list[Subject]:
    """The agent on each node; NVIDIA's plugin where given."""
    out = [_sim_agent(work, plugin_dir)]
    lib = mock_dir()
    if lib is not None:
        out += [_mock_agent(work, plugin_dir, lib, p) for p in PROFILES]
        binary = _nvidia_binary()
        if binary is not None:
            out.append(_nvidia(plugin_dir, lib, binary, work))
    return out


async def floor_run(
    root: Path,
    *,
    rounds: int,
    idle_s: float,
    calls: int,
    xids: int,
    progress: Callable[[str], None],
) -> tuple[list[Figure], str]:
    lib = mock_dir()
    skipped: list[str] = []
    if lib is None:
        skipped.append("agent on mock NVML: skipped (MOCK_NVML_DIR not set)")
    if lib is None or _nvidia_binary() is None:
        skipped.append(
            "NVIDIA's plugin: skipped (needs MOCK_NVML_DIR and NVIDIA_DEVICE_PLUGIN, a binary)"
        )
    for line in skipped:
        progress(line)
    compile_sources()
    results: dict[str, list[Measured]] = {}
    load = [os.getloadavg()[0]]
    ids = [f"noop-{i}" for i in range(8)]
    for r in range(rounds):
        work = root / f"round-{r}"
        work.mkdir()
        floor_dir = Path(tempfile.mkdtemp(prefix="dp-"))  # a socket path fits in 108 bytes
        plugin_dir = Path(tempfile.mkdtemp(prefix="dp-"))
        floor = _noop(floor_dir, ids)
        # The floor is measured first, then kept running for the others' Allocate turns.
        floor_kubelet = Kubelet(floor_dir, seed=1)
        await floor_kubelet.start()
        floor_proc = _spawn(floor, work / "floor-kept.log")
        try:
            await floor_kubelet.wait_until(lambda k: _registered(k, len(ids)), 30)
            reference = (_socket(floor_dir), ids)
            for subject in [_noop(plugin_dir, ids), *subjects(work, plugin_dir)]:
                progress(f"round {r + 1}/{rounds}: {subject.label}")
                log = work / f"{subject.label.split()[0]}-{r}.log"
                measured = await measure(
                    subject,
                    plugin_dir,
                    log,
                    idle_s=idle_s,
                    calls=calls,
                    xids=xids,
                    floor=reference,
                )
                if measured.error:
                    progress(f"  {subject.label}: {measured.error} (log {log})")
                results.setdefault(subject.label, []).append(measured)
                load.append(os.getloadavg()[0])
        finally:
            floor_proc.terminate()
            floor_proc.wait(10)
            await floor_kubelet.stop()
    return _figures(results, rounds, idle_s, calls, max(load)), "\n".join(
        [side_by_side(results), *skipped]
    )


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _medians(runs: Sequence[Measured]) -> dict[str, float | None]:
    xids = [x for m in runs for x in m.xid_s]
    return {
        "register_s": _median([m.register_s for m in runs]),
        "rss_mb": _median([m.rss_mb for m in runs]),
        "idle_pct": _median([m.idle_pct for m in runs]),
        "allocate_ms": _median([m.allocate_ms for m in runs]),
        "ratio": _median(
            [
                m.allocate_ms / m.floor_allocate_ms
                for m in runs
                if m.allocate_ms and m.floor_allocate_ms
            ]
        ),
        "xid_max_s": max(xids) if xids else None,
        "xid_min_s": min(xids) if xids else None,
    }


def side_by_side(results: dict[str, list[Measured]]) -> str:
    """One column per process, medians over the rounds (XID: min-max over every run)."""
    labels = list(results)
    med = {label: _medians(runs) for label, runs in results.items()}

    def cell(label: str, key: str, fmt: str) -> str:
        value = med[label][key]
        return "-" if value is None else fmt.format(value)

    def xid(label: str) -> str:
        low, high = med[label]["xid_min_s"], med[label]["xid_max_s"]
        return "-" if low is None or high is None else f"{low:.2f}-{high:.2f} s"

    rows = [["figure", *labels]]
    rows.append(["Allocate p50", *(cell(lb, "allocate_ms", "{:.2f} ms") for lb in labels)])
    rows.append(["Allocate p50 / floor's", *(cell(lb, "ratio", "{:.2f}x") for lb in labels)])
    rows.append(["RSS", *(cell(lb, "rss_mb", "{:.1f} MB") for lb in labels)])
    rows.append(["start -> registered", *(cell(lb, "register_s", "{:.2f} s") for lb in labels)])
    rows.append(["XID 79 -> Unhealthy", *(xid(lb) for lb in labels)])
    rows.append(["idle CPU", *(cell(lb, "idle_pct", "{:.2f} %") for lb in labels)])
    return markdown(rows)


def _check(name: str, value: float | None, unit: str, limit: float, note: str = "") -> Figure:
    target = f"<= {limit:.2f} {unit}".rstrip()
    if value is None:
        return Figure(name, None, unit, target, None, note)
    return Figure(name, value, unit, target, value <= limit, note)


def _figures(
    results: dict[str, list[Measured]], rounds: int, idle_s: float, calls: int, load: float
) -> list[Figure]:
    labels = list(results)
    floor = _medians(results[labels[0]])
    nvidia = next((lb for lb in labels if lb.startswith("NVIDIA")), None)
    nvidia_idle = _medians(results[nvidia])["idle_pct"] if nvidia else None
    idle_limit = (nvidia_idle if nvidia_idle is not None else NVIDIA_IDLE_PCT) + IDLE_EXTRA_POINTS
    idle_note = (
        "NVIDIA's plugin's idle CPU this run + 0.1 point"
        if nvidia_idle is not None
        else f"NVIDIA's plugin as last measured ({NVIDIA_IDLE_PCT:g} %) + 0.1 point"
    )
    figures: list[Figure] = []
    for label in labels:
        med = _medians(results[label])
        errors = [m.error for m in results[label] if m.error]
        note = "; ".join(errors[:1])
        if not label.startswith("agent"):
            figures.append(Figure(f"Allocate p50, {label}", med["allocate_ms"], "ms", note=note))
            figures.append(Figure(f"RSS, {label}", med["rss_mb"], "MB"))
            figures.append(Figure(f"start -> registered, {label}", med["register_s"], "s"))
            figures.append(Figure(f"idle CPU, {label}", med["idle_pct"], "%"))
            continue
        fr, r = floor["rss_mb"], med["rss_mb"]
        ratio = None if med["ratio"] is None else round(med["ratio"], 2)
        figures.append(_check(f"Allocate p50 / floor, {label}", ratio, "x", ALLOCATE_RATIO, note))
        extra = None if fr is None or r is None else r - fr
        figures.append(_check(f"RSS - floor, {label}", extra, "MB", RSS_EXTRA_MB))
        figures.append(_check(f"start -> registered, {label}", med["register_s"], "s", REGISTER_S))
        figures.append(_check(f"XID 79 -> Unhealthy max, {label}", med["xid_max_s"], "s", XID_S))
        figures.append(_check(f"idle CPU, {label}", med["idle_pct"], "%", idle_limit))
    figures[0] = Figure(
        figures[0].name,
        figures[0].value,
        figures[0].unit,
        note=(
            f"medians over {rounds} round(s), each process in turn under the kubelet stand-in; "
            f"{calls} one-GPU Allocate calls from a blocking client, in blocks of {BLOCK} taken "
            "in turn with as many to the floor (kept running): the ratio is of the two p50s "
            f"of that window; idle CPU: the threads' time on a CPU (schedstat) over "
            f"{idle_s:g} s; XID: every run, max; highest 1-min load average {load:.2f}; "
            f"idle target: {idle_note}"
        ),
    )
    return figures
