"""Degraded devices (docs/degraded.md): each signal the simulated node can inject, from
the node-file edit to GetPreferredAllocation leaving the device out (device-plugin
agent), its `node-agents.io/health` attribute in the ResourceSlice (`--api dra` agent)
and its Event at the API server, and back to Healthy once restored; then what the
probes cost: the idle CPU of the agent with every signal probed beside the agent of the
commit before the signals were wired in, in the same window.

Both agents are subprocesses on production timing (the signal probe period is no flag:
5 s); the bench's config sets a short `health.degraded.holdS`."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agents.core.degraded import PROBE_INTERVAL_S, Limits
from agents.core.gpu_signals import GpuSignals
from agents.core.nic_signals import NicSignals
from agents.core.node_report import HEALTHY_REASON
from agents.kernel.facts import HEALTH
from agents.sim.bundled import DEMO_NODE, bundled_node
from agents.sim.simnode import SimulatedNode
from agents.standin.kubelet import Kubelet
from hack.benchlib.agent import GPU, NIC, AgentProcess, Client, percentile
from hack.benchlib.dra import GPU as DRA_GPU
from hack.benchlib.dra import NIC as DRA_NIC
from hack.benchlib.dra import NODE as DRA_NODE
from hack.benchlib.dra import Bench
from hack.benchlib.figures import Figure, info, markdown
from hack.benchlib.nodes import write_yaml

Obj = dict[str, Any]
DP_NODE = "bench-dp-node"
HOLD_S = 5  # health.degraded.holdS of the bench (default 60)
PERIODS = 3  # the acceptance: within 3 probe periods plus the signal's window
POLL_S = 0.02
SPEED_MBPS = 400_000
IDLE_EXTRA_POINTS = 0.1  # every signal on: at most the reference's idle CPU + 0.1 point
# The commit before the first commit of the degraded-device signals (main's first parent
# of 2ef8df9): the reference for the probes' cost. BENCH_DEGRADED_REFERENCE overrides.
REFERENCE = "24104cc"
REPO = Path(__file__).resolve().parents[2]
DEGRADED_REASON = "DeviceDegraded"
UNHEALTHY_REASON = "DeviceUnhealthy"
RDMA_COUNTER = "symbol_error"


@dataclass(frozen=True)
class Signal:
    """One signal: how it is injected into and taken out of a device's node-file entry,
    and the window its rule needs beyond one probe (docs/degraded.md)."""

    name: str
    kind: str  # "gpus" or "nics"
    inject: Callable[[Obj], None]
    restore: Callable[[Obj], None]
    window_s: float = 0.0
    window: str = "none"
    unhealthy: bool = False  # the signal makes the device Unhealthy, not Degraded

    @property
    def bound_s(self) -> float:
        return PERIODS * PROBE_INTERVAL_S + self.window_s


def _set(**values: Any) -> Callable[[Obj], None]:
    def apply(entry: Obj) -> None:
        for key, value in values.items():
            if isinstance(value, dict):
                entry[key] = {**entry.get(key, {}), **value}
            else:
                entry[key] = value

    return apply


def _counter(name: str, value: int) -> Callable[[Obj], None]:
    def apply(entry: Obj) -> None:
        entry["counters"] = {**entry.get("counters", {}), name: value}

    return apply


SIGNALS: tuple[Signal, ...] = (
    Signal("pcie-width", "gpus", _set(pcie={"width": 8}), _set(pcie={"width": 16})),
    Signal(
        "pcie-gen",
        "gpus",
        _set(pcie={"gen": 4}, utilization=90),
        _set(pcie={"gen": 5}, utilization=0),
    ),
    # A counter's jump is restored by setting it back (a reset): the rule then counts it
    # afresh, and the device is Healthy after holdS rather than after the window.
    Signal(
        "pcie-replays",
        "gpus",
        _set(pcie={"replays": 1000}),
        _set(pcie={"replays": 0}),
        60.0,
        "60 s counter window",
    ),
    Signal("nvlink-down", "gpus", _set(nvlinksDown=2), _set(nvlinksDown=0)),
    Signal(
        "hw-slowdown",
        "gpus",
        _set(clockEvents=["hwSlowdown"]),
        _set(clockEvents=[]),
        (PERIODS - 1) * PROBE_INTERVAL_S,
        "3 probes in a row",
    ),
    Signal(
        "row-remap-pending",
        "gpus",
        _set(remappedRows={"pending": True}),
        _set(remappedRows={"pending": False}),
    ),
    Signal(
        "retired-pages-pending",
        "gpus",
        _set(retiredPagesPending=True),
        _set(retiredPagesPending=False),
    ),
    Signal(
        "row-remap-failed",
        "gpus",
        _set(remappedRows={"failed": True}),
        _set(remappedRows={"failed": False}),
        unhealthy=True,
    ),
    Signal("link-speed", "nics", _set(speedMbps=100_000), _set(speedMbps=SPEED_MBPS)),
    Signal(
        "rdma-errors",
        "nics",
        _counter(RDMA_COUNTER, 1000),
        _counter(RDMA_COUNTER, 0),
        60.0,
        "60 s counter window",
    ),
    Signal(
        "link-flaps",
        "nics",
        _set(carrierChanges=8),
        _set(carrierChanges=2),
        600.0,
        "10 min carrier window",
    ),
)
# Each phase injects its signals at once, each on a device of its own: at most four GPU
# signals, so that every GPU victim has a Healthy GPU to be passed over for.
PHASES: tuple[tuple[str, ...], ...] = (
    ("pcie-width", "pcie-gen", "pcie-replays", "nvlink-down", "link-speed", "rdma-errors"),
    ("hw-slowdown", "row-remap-pending", "retired-pages-pending", "row-remap-failed"),
    ("link-flaps",),
)
EFFECTS = ("kubelet", "slice", "event")


def every_signal_on(doc: Obj) -> Obj:
    """The node with each signal's field present and within limits, so that every signal
    is read (a NIC without a speed file or counters leaves those signals unknown)."""
    for gpu in doc["gpus"]:
        gpu.update(
            pcie={"width": 16, "maxWidth": 16, "gen": 5, "maxGen": 5, "replays": 0},
            utilization=0,
            nvlinksDown=0,
            clockEvents=[],
            remappedRows={"pending": False, "failed": False},
            retiredPagesPending=False,
        )
    for nic in doc["nics"]:
        nic.update(speedMbps=SPEED_MBPS, counters={RDMA_COUNTER: 0}, carrierChanges=2)
    return doc


@dataclass
class Victim:
    """The device a signal is injected into, by every name the three effects use."""

    signal: Signal
    index: int  # in the node file's list
    dp_id: str  # device-plugin ID: GPU UUID or NIC PCI address
    dra_name: str
    partner: str  # a Healthy device that sorts after it: GPA prefers the victim over it
    injected_at: float = 0.0
    seen: dict[str, float] = field(default_factory=dict)
    marks: dict[str, int] = field(default_factory=dict)  # Event counts before the change


@dataclass
class Samples:
    detect: dict[str, list[float]] = field(default_factory=dict)
    recover: dict[str, list[float]] = field(default_factory=dict)


def _events(bench: Bench, node: str, reason: str, device: str) -> int:
    return sum(
        int(e.get("count", 1))
        for e in bench.server.store.events.values()
        if e["involvedObject"]["name"] == node
        and e["reason"] == reason
        and f" device {device} " in e["message"]
    )


def _slice_health(bench: Bench, driver: str, name: str) -> str | None:
    device = bench.devices(driver).get(name)
    if device is None:
        return None
    value = device["attributes"].get(HEALTH, {})
    return str(value.get("string")) if value else None


def _gpa_prefers(client: Client, victim: Victim) -> bool:
    return client.preferred([victim.dp_id, victim.partner], [], 1) == [victim.dp_id]


def _kubelet_state(clients: dict[str, Client], victims: list[Victim]) -> dict[str, bool]:
    """Whether the kubelet would take each victim: GetPreferredAllocation prefers it over
    its partner and ListAndWatch says Healthy (an Unhealthy device is not offered)."""
    out: dict[str, bool] = {}
    listed: dict[str, dict[str, str]] = {}
    for v in victims:
        client = clients[v.signal.kind]
        if v.signal.unhealthy:
            if v.signal.kind not in listed:
                listed[v.signal.kind] = client.devices()
            out[v.signal.name] = listed[v.signal.kind].get(v.dp_id) == "Healthy"
        else:
            out[v.signal.name] = _gpa_prefers(client, v)
    return out


async def _watch(
    bench: Bench,
    clients: dict[str, Client],
    victims: list[Victim],
    bad: bool,
    within: float,
) -> None:
    """Until each victim shows the change (bad: out of limits; else Healthy again) at
    the kubelet, in its slice and as an Event; the time of each first sight."""
    for v in victims:
        v.seen = {}
        reason = (
            (UNHEALTHY_REASON if v.signal.unhealthy else DEGRADED_REASON) if bad else HEALTHY_REASON
        )
        v.marks = {"event": _events(bench, DP_NODE, reason, v.dp_id)}
    deadline = time.monotonic() + within
    while any(len(v.seen) < len(EFFECTS) for v in victims):
        if time.monotonic() > deadline:
            missing = {v.signal.name: sorted(set(EFFECTS) - set(v.seen)) for v in victims}
            raise TimeoutError(f"not seen within {within:g} s: {missing}")
        takes = await asyncio.to_thread(_kubelet_state, clients, victims)
        now = time.monotonic()
        for v in victims:
            driver = DRA_GPU if v.signal.kind == "gpus" else DRA_NIC
            health = _slice_health(bench, driver, v.dra_name)
            if bad:
                reason = UNHEALTHY_REASON if v.signal.unhealthy else DEGRADED_REASON
                shown = {
                    "kubelet": not takes[v.signal.name],
                    "slice": health is None if v.signal.unhealthy else health == "Degraded",
                }
            else:
                reason = HEALTHY_REASON
                shown = {"kubelet": takes[v.signal.name], "slice": health == "Healthy"}
            shown["event"] = _events(bench, DP_NODE, reason, v.dp_id) > v.marks["event"]
            for effect, yes in shown.items():
                if yes and effect not in v.seen:
                    v.seen[effect] = now - v.injected_at
        await asyncio.sleep(POLL_S)


def _victims(doc: Obj, clients: dict[str, Client]) -> dict[str, Victim]:
    """For each signal a device of its kind: within a phase each on its own device, all
    sorting before a partner that is never injected."""
    out: dict[str, Victim] = {}
    for kind, key in (("gpus", "uuid"), ("nics", "pci")):
        ids = sorted(clients[kind].devices())
        partner = ids[-1]
        by_id = {entry[key]: i for i, entry in enumerate(doc[kind])}
        for phase in PHASES:
            names = [s for s in phase if _signal(s).kind == kind]
            for slot, name in enumerate(names):
                i = by_id[ids[slot]]
                entry = doc[kind][i]
                dra = f"gpu-{entry['minor']}" if kind == "gpus" else _nic_name(entry["pci"])
                out[name] = Victim(_signal(name), i, ids[slot], dra, partner)
    return out


def _nic_name(pci: str) -> str:
    return "nic-" + pci.lower().replace(":", "-").replace(".", "-")


def _signal(name: str) -> Signal:
    return next(s for s in SIGNALS if s.name == name)


async def _rounds(
    bench: Bench, node_file: Path, doc: Obj, clients: dict[str, Client], n: int
) -> Samples:
    victims = _victims(doc, clients)
    for v in victims.values():
        if not await asyncio.to_thread(_gpa_prefers, clients[v.signal.kind], v):
            raise RuntimeError(f"GetPreferredAllocation passes over {v.dp_id} while Healthy")
    samples = Samples()
    rng = random.Random(31)
    for _ in range(n):
        for phase in PHASES:
            group = [victims[name] for name in phase]
            # A random moment within the probe period, so that the samples spread over it.
            await asyncio.sleep(rng.uniform(0, PROBE_INTERVAL_S))
            for bad in (True, False):
                for v in group:
                    (v.signal.inject if bad else v.signal.restore)(doc[v.signal.kind][v.index])
                started = time.monotonic()
                for v in group:
                    v.injected_at = started
                write_yaml(node_file, doc)
                longest = max(v.signal.bound_s for v in group)
                within = (longest if bad else HOLD_S + PERIODS * PROBE_INTERVAL_S) + 30.0
                await _watch(bench, clients, group, bad, within)
                into = samples.detect if bad else samples.recover
                for v in group:
                    for effect, at in v.seen.items():
                        into.setdefault(f"{v.signal.name} {effect}", []).append(at)
    return samples


def _dp_agent(work: Path, node_file: Path, kubeconfig: Path) -> AgentProcess:
    extra = ["--kubeconfig", str(kubeconfig), "--node-name", DP_NODE]
    return AgentProcess(work, node_file, config=_config(), extra=extra)


def _config() -> Obj:
    return {"health": {"degraded": {"holdS": HOLD_S}}}


async def latency(work: Path, n: int) -> list[Figure]:
    node_file = work / "node.yaml"
    doc = every_signal_on(yaml.safe_load(bundled_node(DEMO_NODE).read_text()))
    write_yaml(node_file, doc)
    (work / "dra").mkdir()
    (work / "dp").mkdir()
    bench = Bench(work / "dra", node_file)
    bench.server = type(bench.server)((DRA_NODE, DP_NODE))
    bench.server.bookmark_s = 60.0
    async with bench:
        dra_agent = bench.agent()
        (work / "dra" / "config.yaml").write_text(yaml.safe_dump(_config()))
        dra_agent.extra += ["--config", str(work / "dra" / "config.yaml")]
        dp = _dp_agent(work / "dp", node_file, work / "dra" / "kubeconfig")
        dra_agent.start()
        dp.start()
        clients: dict[str, Client] = {}
        try:
            await asyncio.to_thread(dp.wait_serving, [GPU, NIC])
            clients = {"gpus": Client(dp.socket(GPU)), "nics": Client(dp.socket(NIC))}
            deadline = time.monotonic() + 30
            while not (bench.devices(DRA_GPU) and bench.devices(DRA_NIC)):
                if time.monotonic() > deadline:
                    raise TimeoutError("no slices from the DRA agent")
                await asyncio.sleep(POLL_S)
            load = os.getloadavg()[0]
            samples = await _rounds(bench, node_file, doc, clients, n)
            load = max(load, os.getloadavg()[0])
        finally:
            for client in clients.values():
                client.channel.close()
            dp.stop()
            dra_agent.stop()
    return _latency_figures(samples, n, load)


def _latency_figures(samples: Samples, n: int, load: float) -> list[Figure]:
    figures: list[Figure] = []
    recovery_s = HOLD_S + PERIODS * PROBE_INTERVAL_S
    for s in SIGNALS:
        for effect in EFFECTS:
            seconds = samples.detect[f"{s.name} {effect}"]
            name = f"{s.name} -> {_effect(effect, s)}"
            figures.append(info(f"{name} p50", percentile(seconds, 50), "s"))
            top = max(seconds)
            figures.append(Figure(f"{name} max", top, "s", f"<= {s.bound_s:g} s", top <= s.bound_s))
        back = _recovered(samples, s, n)
        figures.append(
            info(f"{s.name} restored -> Healthy everywhere p50", percentile(back, 50), "s")
        )
        top = max(back)
        figures.append(
            Figure(
                f"{s.name} restored -> Healthy everywhere max",
                top,
                "s",
                f"<= {recovery_s:g} s",
                top <= recovery_s,
            )
        )
    first = figures[0]
    figures[0] = Figure(
        first.name,
        first.value,
        first.unit,
        note=f"{n} injection(s) per signal; production probe period {PROBE_INTERVAL_S:g} s, "
        f"holdS {HOLD_S} s (bench config; default 60); target: 3 probe periods + the "
        f"signal's window; recovery (the last of GPA, slice and DeviceHealthy Event): "
        f"holdS + 3 periods; the signals of a phase injected at once, each on a device of "
        f"its own; 1-min load average up to {load:.2f}",
    )
    return figures


def _recovered(samples: Samples, s: Signal, n: int) -> list[float]:
    """Per restore, when the last of the three effects showed the device Healthy."""
    return [max(samples.recover[f"{s.name} {e}"][i] for e in EFFECTS) for i in range(n)]


def per_signal(figures: list[Figure]) -> str:
    """One row per signal: p50 / max of each effect and of the recovery, beside the bound."""
    by_name = {f.name: f.value for f in figures}

    def cell(name: str) -> str:
        p50, top = by_name.get(f"{name} p50"), by_name.get(f"{name} max")
        return "-" if p50 is None or top is None else f"{p50:.1f} / {top:.1f}"

    rows = [["signal", "bound", "kubelet (GPA)", "DRA slice", "Event", "Healthy again"]]
    for s in SIGNALS:
        effects = [cell(f"{s.name} -> {_effect(e, s)}") for e in EFFECTS]
        rows.append(
            [s.name, f"{s.bound_s:g} s", *effects, cell(f"{s.name} restored -> Healthy everywhere")]
        )
    return markdown(rows)


def _effect(effect: str, s: Signal) -> str:
    if effect == "kubelet":
        return "ListAndWatch Unhealthy" if s.unhealthy else "GPA without it"
    if effect == "slice":
        return "out of the slice" if s.unhealthy else "slice health Degraded"
    return "DeviceUnhealthy Event" if s.unhealthy else "DeviceDegraded Event"


class ReferenceAgent(AgentProcess):
    """The agent of another commit, from a worktree of its own, on this interpreter."""

    def __init__(self, tree: Path, work: Path, node_file: Path) -> None:
        super().__init__(work, node_file)
        self.tree = tree

    def command(self) -> list[str]:
        main = "import sys; from agents.cli import main; sys.exit(main())"
        cmd = [sys.executable, "-c", main, "run", "--simulate", str(self.node_file)]
        return [*cmd, "--device-plugin-dir", str(self.plugin_dir), "--log-format", "json"]

    def start(self) -> None:
        log = (self.work / "agent.log").open("ab")
        env = {**os.environ, "PYTHONPATH": str(self.tree)}
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, cwd="/"
        )
        log.close()


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True)
    return done.stdout.decode().strip()


def _registered(kubelet: Kubelet) -> bool:
    views = [kubelet.resource(name) for name in (GPU, NIC)]
    return all(v is not None and v.connected and v.devices for v in views)


async def cost(work: Path, idle_s: float) -> list[Figure]:
    """Both agents registered with kubelet stand-ins of their own, at rest in one window."""
    reference = os.environ.get("BENCH_DEGRADED_REFERENCE", REFERENCE)
    names = ("reference", "probed")
    try:
        commit = _git("rev-parse", "--short", f"{reference}^{{commit}}")
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        note = f"no commit {reference} here ({type(exc).__name__})"
        return [Figure(f"idle CPU, {n}", None, "%", note=note) for n in names]
    tree = work / "reference-tree"
    _git("worktree", "add", "--detach", str(tree), commit)
    try:
        return await _cost(work, tree, commit, idle_s)
    finally:
        _git("worktree", "remove", "--force", str(tree))


async def _cost(work: Path, tree: Path, commit: str, idle_s: float) -> list[Figure]:
    (work / "ref").mkdir()
    (work / "new").mkdir()
    plain = work / "ref" / "node.yaml"
    shutil.copy(bundled_node(DEMO_NODE), plain)
    full = write_yaml(
        work / "new" / "node.yaml",
        every_signal_on(yaml.safe_load(bundled_node(DEMO_NODE).read_text())),
    )
    agents = {
        "reference": ReferenceAgent(tree, work / "ref", plain),
        "probed": AgentProcess(work / "new", full),
    }
    kubelets = {k: Kubelet(a.plugin_dir, seed=1) for k, a in agents.items()}
    for kubelet in kubelets.values():
        await kubelet.start()
    try:
        for agent in agents.values():
            agent.start()
        for key, kubelet in kubelets.items():
            await kubelet.wait_until(_registered, 60)
            agents[key]._check_alive()
        await asyncio.sleep(2 * PROBE_INTERVAL_S)  # start-up work and the first probes done
        load = [os.getloadavg()[0]]
        before = {k: a.cpu_seconds() for k, a in agents.items()}
        at = time.monotonic()
        await asyncio.sleep(idle_s)
        window = time.monotonic() - at
        cpu = {k: a.cpu_seconds() - before[k] for k, a in agents.items()}
        load.append(os.getloadavg()[0])
    finally:
        for agent in agents.values():
            agent.stop()
        for kubelet in kubelets.values():
            await kubelet.stop()
    ref_pct = cpu["reference"] / window * 100
    new_pct = cpu["probed"] / window * 100
    rounds = window / PROBE_INTERVAL_S
    per_round_ms = (cpu["probed"] - cpu["reference"]) / rounds * 1000
    limit = ref_pct + IDLE_EXTRA_POINTS
    return [
        info(
            "idle CPU, reference agent",
            ref_pct,
            "%",
            f"{ref_pct:.3f} %, commit {commit} (before the signals), {DEMO_NODE} (8 GPUs, "
            f"8 NICs), "
            f"utime+stime over {window:.0f} s (clock tick 10 ms), both agents at rest in "
            f"the same window, each under a kubelet stand-in; load average "
            f"{load[0]:.2f} -> {load[1]:.2f}",
        ),
        Figure(
            "idle CPU, every signal probed",
            new_pct,
            "%",
            f"<= {limit:.2f} %",
            new_pct <= limit,
            f"{new_pct:.3f} % (+{new_pct - ref_pct:.3f} point), this tree, the same node with "
            f"every signal's field present and within limits "
            f"(8 GPU and 3 NIC signals per device); target: the reference + "
            f"{IDLE_EXTRA_POINTS:g} point",
        ),
        info(
            "CPU per probe round, from the idle difference",
            per_round_ms,
            "ms",
            f"(probed - reference) CPU over {rounds:.0f} probe periods of "
            f"{PROBE_INTERVAL_S:g} s: 8 GPUs and 8 NICs read off the loop and judged; "
            "includes any other change since the reference",
        ),
    ]


def round_cpu(work: Path, rounds: int) -> Figure:
    """One probe round as the agent's worker thread does it, in this process: read every
    GPU's and NIC's signals on the simulated node and judge them; CPU time per round."""
    node_file = write_yaml(
        work / "node.yaml", every_signal_on(yaml.safe_load(bundled_node(DEMO_NODE).read_text()))
    )
    sim = SimulatedNode(node_file, work / "root")
    spec = sim.load()
    sim.nvml.init()
    limits = Limits()
    gpus = {g.uuid: GpuSignals(limits, time.monotonic) for g in spec.gpus}
    nics = {n.pci: NicSignals(n.netdev, limits, time.monotonic) for n in spec.nics}
    started = time.thread_time()
    for _ in range(rounds):
        for uuid, gpu in gpus.items():
            gpu.observe(sim.nvml.probe(uuid))
        for nic in spec.nics:
            nics[nic.pci].observe(sim.sysfs.nic_reading(nic.netdev, nic.rdma), SPEED_MBPS)
    per_round = (time.thread_time() - started) / rounds * 1000
    sim.nvml.shutdown()
    return info(
        "CPU per probe round, in-process",
        per_round,
        "ms",
        f"thread CPU time over {rounds} rounds of reading and judging 8 GPUs (simulated "
        f"NVML) and 8 NICs (sysfs files), {per_round / PROBE_INTERVAL_S / 10:.3f} % of a "
        f"core at one round per {PROBE_INTERVAL_S:g} s; the real backend's NVML calls "
        "are driver calls and not measured here",
    )


async def degraded_figures(
    root: Path, n: int, idle_s: float, progress: Callable[[str], None]
) -> list[Figure]:
    (root / "latency").mkdir()
    (root / "cost").mkdir()
    progress(f"degraded: {n} injection(s) of each of {len(SIGNALS)} signals")
    figures = await latency(root / "latency", n)
    progress(f"degraded: idle CPU, every signal probed vs {REFERENCE}, {idle_s:g} s")
    figures += await cost(root / "cost", idle_s)
    (root / "round").mkdir()
    figures.append(round_cpu(root / "round", 200))
    return figures
