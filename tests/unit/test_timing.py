"""The production hold times and probe periods, as docs/architecture.md and
docs/configuration.md state them; tests run the agent on shorter ones (tests/timing.py)."""

from __future__ import annotations

from agents.daemon import Agent
from agents.family import Context
from agents.timing import PRODUCTION, Timing


def test_production_timing_is_what_the_docs_say() -> None:
    # NVML answers normally 3 s before a GPU is Healthy again; NVML is probed once a
    # second; an NVML event wait with no news ends after 5 s; NIC flaps within 2 s of a
    # report are held; the RDMA port is read every 5 s; degraded-device signals are read
    # every 5 s (docs/degraded.md).
    assert Timing() == PRODUCTION
    assert (
        Timing(
            gpu_hold_s=3.0,
            gpu_probe_s=1.0,
            gpu_event_wait_s=5.0,
            nic_flap_hold_s=2.0,
            nic_port_poll_s=5.0,
            signal_probe_s=5.0,
        )
        == PRODUCTION
    )


def test_the_agent_and_every_family_run_on_production_timing_unless_told() -> None:
    assert Agent.timing is PRODUCTION
    assert Context.timing is PRODUCTION
