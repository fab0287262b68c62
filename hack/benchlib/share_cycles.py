"""100 shares on one node (4 GPUs x 25 shares, from 50 claims of 1, 2 and 4 GPUs) prepared
and then all unprepared, cycle after cycle: after each cycle the driver's CDI specs are
back to those before, its checkpoint holds no claim, every GPU's compute mode is back to
DEFAULT, and the agent's memory, open files and threads do not grow."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agents.dra.claim_checkpoint import CHECKPOINT, ClaimCheckpoint
from hack.benchlib.agent import AgentProcess, no_collection
from hack.benchlib.dra import GPU
from hack.benchlib.figures import Figure, below, info
from hack.benchlib.share_modes import compute_mode_figures

if TYPE_CHECKING:
    from hack.benchlib.shares import SharedNode

GPUS = 4
PER_GPU = 25
RSS_GROWTH_MB = 2.0  # from the end of the first cycle to the end of the last
FD_GROWTH = 2  # the same span: a connection to the API server replaced meanwhile
SETTLE_S = 5.0  # for the threads of the last calls (each ends just after its answer) to end


@dataclass(frozen=True)
class Reading:
    rss_mb: float
    fds: int
    threads: int
    cdi: int  # the driver's CDI spec files
    claims: int  # in its checkpoint
    shares: int
    log: int  # the agent's log's size: where the lines after this reading begin


def layout() -> list[list[int]]:
    """GPU indices of each claim: 20 of one share, 20 of two and 10 of four; 25 each."""
    one = [[i % GPUS] for i in range(20)]
    two = [[0, 1] if i % 2 == 0 else [2, 3] for i in range(20)]
    claims = one + two + [list(range(GPUS))] * 10
    assert all(sum(g in c for c in claims) == PER_GPU for g in range(GPUS))
    return claims


def reading(node: SharedNode, agent: AgentProcess) -> Reading:
    work = node.bench.work
    prepared = ClaimCheckpoint(work / "plugins" / GPU / CHECKPOINT).load()
    cdi = [p for p in (work / "cdi").glob(f"k8s.{GPU}-*") if p.is_file()]
    return Reading(
        agent.rss_kib() / 1024,
        agent.fd_count(),
        agent.thread_count(),
        len(cdi),
        len(prepared),
        sum(1 for c in prepared.values() for d in c.devices if d.share_id),
        (agent.work / "agent.log").stat().st_size,
    )


async def settled(node: SharedNode, agent: AgentProcess, threads: int) -> Reading:
    """A reading once the agent runs no more threads than `threads`, or after SETTLE_S: a
    worker thread of a call (a checkpoint write, a compute mode set) ends a moment after
    the call is answered, and the agent's probes run some now and then."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        if agent.thread_count() <= threads or time.monotonic() > deadline:
            return reading(node, agent)
        await asyncio.sleep(0.01)  # polling another process, with a deadline


async def cycle_figures(node: SharedNode, agent: AgentProcess, cycles: int) -> list[Figure]:
    from hack.benchlib.shares import timed

    gpus = sorted(node.bench.devices(GPU))[:GPUS]
    claims = layout()
    before = reading(node, agent)
    after: list[Reading] = []
    peaks: list[Reading] = []
    seconds: list[float] = []
    with no_collection():
        for cycle in range(cycles):
            refs = [
                node.claim(f"cycle{cycle}-{j}", [gpus[g] for g in c], share=True)
                for j, c in enumerate(claims)
            ]
            started = time.perf_counter()
            for ref in refs:
                await timed(node.bench.kubelet.prepare, ref)
            peaks.append(reading(node, agent))
            for ref in refs:
                await timed(node.bench.kubelet.unprepare, ref)
            seconds.append(time.perf_counter() - started)
            # a worker thread started at first use stays: a leak grows from cycle to cycle
            after.append(await settled(node, agent, (after[0] if after else before).threads))
    figures = _figures(before, peaks, after, seconds, len(claims))
    log, start = agent.work / "agent.log", node.log_start
    marks = [p.log for p in peaks], [a.log for a in after]
    return [*figures, *compute_mode_figures(log, start, *marks, GPUS)]


def _figures(
    before: Reading, peaks: list[Reading], after: list[Reading], seconds: list[float], n: int
) -> list[Figure]:
    cycles = len(after)
    total = GPUS * PER_GPU
    peak_ok = all(p.shares == total and p.claims == n and p.cdi == before.cdi + n for p in peaks)
    left = max(a.cdi - before.cdi for a in after)
    kept = max(a.claims for a in after)
    first, last = after[0], after[-1]

    def each(values: list[object]) -> str:
        return ", ".join(str(v) for v in values)

    return [
        Figure(
            f"{total} shares prepared at each peak",
            float(min(p.shares for p in peaks)),
            "",
            f"{total}, {n} claims",
            peak_ok,
            f"{GPUS} GPUs x {PER_GPU} shares of memory 3Gi, compute 4, from {n} claims (of 1, "
            f"2 and 4 GPUs), one NodePrepareResources each, then all unprepared; {cycles} "
            f"cycles, {each([f'{s:.2f} s' for s in seconds])} each; checkpoint and CDI specs "
            "read at the peak",
        ),
        Figure(
            "CDI spec files left after a cycle",
            float(left),
            "",
            "0",
            left == 0,
            f"the driver's files in the CDI root beyond the {before.cdi} before the first cycle",
        ),
        Figure("checkpointed claims left after a cycle", float(kept), "", "0", kept == 0),
        below(
            "agent RSS growth, first cycle -> last",
            last.rss_mb - first.rss_mb,
            "MB",
            RSS_GROWTH_MB,
            f"RSS before and after each cycle: {before.rss_mb:.1f}; "
            f"{each([f'{a.rss_mb:.1f}' for a in after])} MB",
        ),
        Figure(
            "agent open fds growth, first cycle -> last",
            float(last.fds - first.fds),
            "",
            f"<= {FD_GROWTH}",
            last.fds - first.fds <= FD_GROWTH,
            f"/proc/<pid>/fd before and after each cycle: {before.fds}; "
            f"{each([a.fds for a in after])}",
        ),
        Figure(
            "agent threads growth, first cycle -> last",
            float(max(a.threads for a in after) - first.threads),
            "",
            "<= 0",
            all(a.threads <= first.threads for a in after),
            f"before and after each cycle: {before.threads}; {each([a.threads for a in after])}"
            f" (each read once at most the first cycle's or {SETTLE_S:g} s on: a call's worker "
            "thread ends a moment after its answer; one started at first use stays)",
        ),
        info("agent RSS after the last cycle", last.rss_mb, "MB"),
    ]
