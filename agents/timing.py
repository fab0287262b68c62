"""How long the agent holds and how often it looks: one value with the production
defaults, passed to every family, so that tests run the same code on short times."""

from __future__ import annotations

from dataclasses import dataclass

from agents.core.degraded import PROBE_INTERVAL_S as SIGNAL_PROBE_S
from agents.core.xid import HOLD_S
from agents.hw.nvml_calls import HANG_S

PROBE_INTERVAL_S = 1.0  # GPUs that fall off the bus without an event are seen within this
# A RoCE port's state follows its netdev's carrier, whose changes netlink pushes at once:
# the poll is a backstop, and reading every NIC's port file each second cost a third of
# an idle agent's CPU time.
PORT_POLL_S = 5.0
FLAP_HOLD_S = 2.0  # after a reported change, later flaps of that NIC wait this long
# An event wait ends early with news (an XID, a GPU lost): its length only bounds how long a
# hung wait goes unlogged, and each wait that runs out wakes the event loop for nothing.
EVENT_WAIT_S = 5.0
# While another API's leftovers hold devices (agents/kernel/handover.py), the kubelet is
# asked again this often which pods still run: a pod's end is seen within it.
HELD_CLAIMS_POLL_S = 5.0  # device-plugin mode: which DRA claims' pods still run
HELD_PODS_POLL_S = 5.0  # DRA mode: which device-plugin pods still hold devices
MPS_RESTART_S = 5.0  # a dead MPS control daemon's devices stay Unhealthy at least this long
HOLDERS_POLL_S = 10.0  # with metrics: which pod holds each device (and at every scrape)


@dataclass(frozen=True)
class Timing:
    gpu_hold_s: float = HOLD_S  # NVML answers normally this long before a GPU is Healthy
    gpu_probe_s: float = PROBE_INTERVAL_S  # NVML is asked about every GPU this often
    gpu_event_wait_s: float = EVENT_WAIT_S  # one wait for NVML events, when none arrives
    gpu_hang_s: float = HANG_S  # an NVML call unanswered this long: the GPU is hung
    nic_flap_hold_s: float = FLAP_HOLD_S
    nic_port_poll_s: float = PORT_POLL_S
    signal_probe_s: float = SIGNAL_PROBE_S  # degraded-device signals read this often
    held_claims_poll_s: float = HELD_CLAIMS_POLL_S
    held_pods_poll_s: float = HELD_PODS_POLL_S
    holders_poll_s: float = HOLDERS_POLL_S
    mps_restart_s: float = MPS_RESTART_S  # an MPS control daemon down this long is restarted


PRODUCTION = Timing()
