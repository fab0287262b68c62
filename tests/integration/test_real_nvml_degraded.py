"""Degraded GPUs on the real NVML backend (pynvml, no --simulate) over the project's test
NVML library, through the kubelet stand-in: each GPU signal both ways (chosen last by
GetPreferredAllocation while the kubelet hears Healthy; back in the usual choice after
holdS), and the signals that make a GPU Unhealthy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.standin.kubelet import Kubelet
from tests.conditions import PROCESS_WAIT as START_WAIT
from tests.conditions import WAIT
from tests.nvml.harness import AgentProcess, Lab, health, start_agent
from tests.nvml.state import Signals

GPU = "nvidia.com/gpu"
HOLD_S = 1
INDEX = 2  # the GPU the signals are injected on
POLL_S = 0.02  # between two preferred-allocation requests

Change = Callable[[Signals], None]


def _set(**fields: object) -> Change:
    def change(signals: Signals) -> None:
        for name, value in fields.items():
            setattr(signals, name, value)

    return change


# signal -> (out of limits, back within them)
SIGNALS: dict[str, tuple[Change, Change]] = {
    "pcie-width": (_set(pcie_width=8), _set(pcie_width=16)),
    "pcie-gen": (_set(pcie_gen=4, utilization=90), _set(pcie_gen=5)),
    # The counter grows past 30.72 a minute (Gen5 x16); a reset starts it afresh.
    "pcie-replays": (_set(replays=500), _set(replays=0)),
    "nvlink-down": (_set(links_down=2), _set(links_down=0)),
    "hw-slowdown": (_set(clock_events=0x40), _set(clock_events=0)),
    "row-remap-pending": (_set(remap_pending=True), _set(remap_pending=False)),
    "retired-pages-pending": (_set(retired_pending=True), _set(retired_pending=False)),
    "recovery-action": (_set(recovery=3), _set(recovery=0)),  # DRAIN_P2P
}


@dataclass
class Run:
    kubelet: Kubelet
    agent: AgentProcess
    lab: Lab

    @property
    def uuid(self) -> str:
        return self.lab.uuids[INDEX]

    def change(self, change: Change) -> None:
        change(self.lab.node.gpus[INDEX].signals)
        self.lab.apply()

    async def preferred(self, size: int) -> set[str]:
        endpoint = self.kubelet.endpoint(GPU)
        assert endpoint is not None
        return set(await endpoint.preferred(self.lab.uuids, [], size))

    async def until_preferred(self, want: Callable[[set[str]], bool], within: float) -> float:
        """Seconds until GetPreferredAllocation (7 of 8) answers as wanted."""
        began = time.monotonic()
        while not want(answer := await self.preferred(7)):
            assert time.monotonic() - began < within, f"still {sorted(answer)}"
            await asyncio.sleep(POLL_S)
        return time.monotonic() - began


@asynccontextmanager
async def running(tmp_path: Path, plugin_dir: Path, *config: str) -> AsyncIterator[Run]:
    lab = Lab("own", "h100", tmp_path)
    lab.node.gpus[INDEX].signals.retired = True  # offers page retirement (NVML on Turing)
    lab.node.gpus[INDEX].signals.recovery = 0  # a driver that offers the recovery action
    lab.apply()
    config_file = tmp_path / "config.yaml"
    config_file.write_text(
        "version: v1\nhealth:\n  degraded:\n" + "".join(f"    {line}\n" for line in config)
    )
    kubelet = Kubelet(plugin_dir, seed=3)
    await kubelet.start()
    agent = start_agent(
        lab, plugin_dir, tmp_path / "agent.stderr", "--config", str(config_file), short_timing=True
    )
    try:
        await kubelet.wait_until(lambda k: set(health(k).values()) == {"Healthy"}, START_WAIT)
        await kubelet.wait_until(lambda k: len(health(k)) == 8, START_WAIT)
        yield Run(kubelet, agent, lab)
    finally:
        agent.stop()
        await kubelet.stop()
        print(agent.stderr[-3000:])


@pytest.mark.parametrize("signal", list(SIGNALS))
async def test_each_gpu_signal_is_chosen_last_while_out_of_limits_and_back_after_the_hold(
    tmp_path: Path, plugin_dir: Path, signal: str
) -> None:
    bad, good = SIGNALS[signal]
    async with running(tmp_path, plugin_dir, f"holdS: {HOLD_S}") as run:
        baseline = await run.preferred(7)
        assert run.uuid in baseline
        run.change(bad)
        seen = await run.until_preferred(lambda chosen: run.uuid not in chosen, WAIT)
        assert health(run.kubelet)[run.uuid] == "Healthy"
        run.change(good)
        took = await run.until_preferred(lambda chosen: chosen == baseline, WAIT + HOLD_S)
        print(f"{signal}: chosen last after {seen:.2f} s, back after {took:.2f} s")
        assert took >= HOLD_S / 2  # held, not let go at the first probe within limits
        # A query NVML does not offer (page retirement on an H100) is told once per GPU
        # and never makes it Degraded.
        other = run.lab.uuids[0]
        told = [
            line
            for line in run.agent.stderr.splitlines()
            if "device_signal_unknown" in line and other in line and "retired-pages" in line
        ]
        assert len(told) == 1, told


@pytest.mark.parametrize(
    "change",
    [_set(remap_failed=True), _set(recovery=1), _set(recovery=2), _set(recovery=4)],
    ids=["row-remap-failed", "GPU_RESET", "NODE_REBOOT", "DRAIN_AND_RESET"],
)
async def test_signals_that_need_a_reset_or_a_new_gpu_make_it_unhealthy(
    tmp_path: Path, plugin_dir: Path, change: Change
) -> None:
    async with running(tmp_path, plugin_dir, f"holdS: {HOLD_S}") as run:
        run.change(change)
        await run.kubelet.wait_until(lambda k: health(k)[run.uuid] == "Unhealthy", WAIT)


async def test_report_unhealthy_and_a_reload_of_the_limits(
    tmp_path: Path, plugin_dir: Path
) -> None:
    async with running(tmp_path, plugin_dir, "holdS: 3600", "report: unhealthy") as run:
        run.change(SIGNALS["pcie-width"][0])
        await run.kubelet.wait_until(lambda k: health(k)[run.uuid] == "Unhealthy", WAIT)
        run.change(SIGNALS["pcie-width"][1])
        # Held for an hour: a reload (SIGHUP) to a short hold lets it go.
        (tmp_path / "config.yaml").write_text(
            f"version: v1\nhealth:\n  degraded:\n    holdS: {HOLD_S}\n    report: unhealthy\n"
        )
        run.agent.process.send_signal(1)
        await run.kubelet.wait_until(lambda k: health(k)[run.uuid] == "Healthy", WAIT + HOLD_S)
