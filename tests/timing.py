"""Hold times and probe periods short enough for a test to wait out: the agent's own code,
on times a tenth or less of production's (agents.timing)."""

from __future__ import annotations

from agents.timing import Timing

SHORT = Timing(gpu_hold_s=0.3, gpu_probe_s=0.2, nic_flap_hold_s=0.2, nic_port_poll_s=0.5)
