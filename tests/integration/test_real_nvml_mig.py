"""MIG on the real NVML backend (pynvml, no --simulate) over the project's NVML library:
migStrategy none / single / mixed on a mixed A100 layout and a uniform H100 one, the
resources and device IDs docs/configuration.md gives, what Allocate names, health (an XID on a
parent turns its instances Unhealthy; an application XID does not), replicas of MIG
instances."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from agents.gpu.allocation import VISIBLE_DEVICES
from agents.standin.kubelet import Container, Kubelet, Pod
from tests.conditions import PROCESS_WAIT as START_WAIT
from tests.nvml.harness import AgentProcess, Lab, start_agent
from tests.nvml.nodes import MIG_LAYOUTS, with_mig

GPU = "nvidia.com/gpu"
FAULT_WAIT = 10.0
XID_FELL_OFF_BUS = 79
XID_APPLICATION = 13  # a graphics engine exception: the application's fault, not the GPU's


def _strategy(name: str, extra: str = "") -> str:
    return f"version: v1\nflags:\n  migStrategy: {name}\n{extra}"


@dataclass
class Run:
    kubelet: Kubelet
    agent: AgentProcess
    lab: Lab

    def migs(self, index: int, profile: str | None = None) -> set[str]:
        """MIG UUIDs of GPU `index` (of one profile, when given)."""
        gpu = self.lab.node.gpus[index]
        return {m.uuid for m in gpu.migs if profile is None or m.profile == profile}

    def health(self, resource: str) -> dict[str, str]:
        view = self.kubelet.resource(resource)
        return {} if view is None else {i: s.health for i, s in view.devices.items()}

    async def allocatable(self, want: dict[str, int]) -> None:
        await self.kubelet.wait_until(lambda k: k.allocatable() == want, FAULT_WAIT)


@asynccontextmanager
async def running(layout: str, config: str, tmp_path: Path, plugin_dir: Path) -> AsyncIterator[Run]:
    lab = Lab("own", MIG_LAYOUTS[layout][0], tmp_path, with_mig(layout))
    (tmp_path / "config.yaml").write_text(config)
    kubelet = Kubelet(plugin_dir, seed=7)
    await kubelet.start()
    agent = start_agent(
        lab, plugin_dir, tmp_path / "agent.stderr", "--config", str(tmp_path / "config.yaml")
    )
    try:
        yield Run(kubelet, agent, lab)
        code, _ = agent.terminate(5.0)
        assert code == 0, agent.stderr[-2000:]
    finally:
        agent.stop()
        await kubelet.stop()
        print(agent.stderr[-3000:])


A100_MIXED = {
    "nvidia.com/mig-1g.5gb": 9,
    "nvidia.com/mig-2g.10gb": 1,
    "nvidia.com/mig-3g.20gb": 1,
    "nvidia.com/mig-7g.40gb": 1,
    GPU: 5,
}


async def test_mixed_on_a100_offers_each_profile_and_the_whole_gpus(
    tmp_path: Path, plugin_dir: Path
) -> None:
    async with running("a100-mixed", _strategy("mixed"), tmp_path, plugin_dir) as run:
        await run.kubelet.wait_until(lambda k: k.allocatable() == A100_MIXED, START_WAIT)
        small = run.migs(0, "1g.5gb") | run.migs(2, "1g.5gb")
        assert set(run.health("nvidia.com/mig-1g.5gb")) == small
        assert set(run.health("nvidia.com/mig-3g.20gb")) == run.migs(0, "3g.20gb")
        assert set(run.health("nvidia.com/mig-7g.40gb")) == run.migs(1)
        assert set(run.health(GPU)) == set(run.lab.uuids[3:])

        pod = Pod("p", [Container("c", {"nvidia.com/mig-1g.5gb": 2, "nvidia.com/mig-3g.20gb": 1})])
        got = (await run.kubelet.admit(pod)).containers["c"]
        visible = got.responses["nvidia.com/mig-1g.5gb"].envs[VISIBLE_DEVICES].split(",")
        assert sorted(visible) == sorted(got.devices["nvidia.com/mig-1g.5gb"])
        assert set(visible) <= small
        three = got.responses["nvidia.com/mig-3g.20gb"].envs[VISIBLE_DEVICES]
        assert {three} == run.migs(0, "3g.20gb")


async def test_an_xid_on_a_parent_turns_only_its_instances_unhealthy(
    tmp_path: Path, plugin_dir: Path
) -> None:
    async with running("a100-mixed", _strategy("mixed"), tmp_path, plugin_dir) as run:
        await run.kubelet.wait_until(lambda k: k.allocatable() == A100_MIXED, START_WAIT)
        # The application XID first: events arrive in order, so once the XID 79 after it
        # shows, the application XID has been seen and ignored.
        run.lab.node.xid(1, XID_APPLICATION)
        run.lab.node.xid(0, XID_FELL_OFF_BUS)
        run.lab.apply()
        await run.allocatable(
            {
                "nvidia.com/mig-1g.5gb": 7,  # GPU 2's seven; GPU 0's two are gone
                "nvidia.com/mig-2g.10gb": 0,
                "nvidia.com/mig-3g.20gb": 0,
                "nvidia.com/mig-7g.40gb": 1,  # GPU 1: the application XID changed nothing
                GPU: 5,
            }
        )
        sick = {i for i, h in run.health("nvidia.com/mig-1g.5gb").items() if h != "Healthy"}
        assert sick == run.migs(0, "1g.5gb")


async def test_single_on_h100_offers_every_instance_as_a_gpu(
    tmp_path: Path, plugin_dir: Path
) -> None:
    async with running("h100-uniform", _strategy("single"), tmp_path, plugin_dir) as run:
        every = set().union(*(run.migs(i) for i in range(8)))
        assert len(every) == 56
        await run.kubelet.wait_until(lambda k: k.allocatable() == {GPU: 56}, START_WAIT)
        assert set(run.health(GPU)) == every

        got = await run.kubelet.admit(Pod("p", [Container("c", {GPU: 3})]))
        env = got.containers["c"].responses[GPU].envs[VISIBLE_DEVICES].split(",")
        assert sorted(env) == sorted(got.devices("c", GPU)) and set(env) <= every

        run.lab.node.xid(3, XID_FELL_OFF_BUS)
        run.lab.apply()
        await run.allocatable({GPU: 49})
        assert {i for i, h in run.health(GPU).items() if h != "Healthy"} == run.migs(3)


async def test_none_on_h100_offers_whole_gpus(tmp_path: Path, plugin_dir: Path) -> None:
    async with running("h100-uniform", _strategy("none"), tmp_path, plugin_dir) as run:
        await run.kubelet.wait_until(lambda k: k.allocatable() == {GPU: 8}, START_WAIT)
        assert set(run.health(GPU)) == set(run.lab.uuids)


async def test_mixed_on_h100_offers_one_profile_and_no_whole_gpu(
    tmp_path: Path, plugin_dir: Path
) -> None:
    async with running("h100-uniform", _strategy("mixed"), tmp_path, plugin_dir) as run:
        await run.kubelet.wait_until(
            lambda k: (
                Counter({r: n for r, n in k.allocatable().items() if n})
                == Counter({"nvidia.com/mig-1g.10gb": 56})
            ),
            START_WAIT,
        )


async def test_replicas_of_mig_instances_on_the_real_backend(
    tmp_path: Path, plugin_dir: Path
) -> None:
    sharing = (
        "sharing:\n  timeSlicing:\n    resources:\n"
        "      - {name: nvidia.com/mig-7g.40gb, replicas: 2}\n"
    )
    async with running("a100-mixed", _strategy("mixed", sharing), tmp_path, plugin_dir) as run:
        want = A100_MIXED | {"nvidia.com/mig-7g.40gb": 2}
        await run.kubelet.wait_until(lambda k: k.allocatable() == want, START_WAIT)
        (mig,) = run.migs(1)
        assert set(run.health("nvidia.com/mig-7g.40gb")) == {f"{mig}::0", f"{mig}::1"}
        endpoint = run.kubelet.endpoint("nvidia.com/mig-7g.40gb")
        assert endpoint is not None
        answer = await endpoint.allocate([f"{mig}::0", f"{mig}::1"])
        assert answer.envs[VISIBLE_DEVICES] == mig


def test_single_on_the_mixed_a100_exits_2_naming_the_key(tmp_path: Path) -> None:
    lab = Lab("own", "a100", tmp_path, with_mig("a100-mixed"))
    config = tmp_path / "config.yaml"
    config.write_text(_strategy("single"))
    done = subprocess.run(
        [
            *(sys.executable, "-m", "agents.cli", "run", "--families", "gpu"),
            *("--config", str(config), "--device-plugin-dir", str(tmp_path)),
        ],
        env=lab.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"node-agent: {config}: flags.migStrategy: "), last
