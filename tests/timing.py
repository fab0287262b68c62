"""Hold times and probe periods short enough for a test to wait out: the agent's own code,
on times a tenth or less of production's (agents.timing; NVML's hang bound a third). Run
as a module (`python -m tests.timing run ...`) it is `node-agent` on them, for tests that
start the agent as a process."""

from __future__ import annotations

import sys

from agents.cli import main
from agents.timing import Timing

SHORT = Timing(
    gpu_hold_s=0.3,
    gpu_probe_s=0.2,
    gpu_event_wait_s=1.0,
    # A third of production's: another GPU's fault, seen within 2 s, still shows before a
    # hung GPU is marked (tests/integration/test_real_nvml_faults.py).
    gpu_hang_s=3.0,
    nic_flap_hold_s=0.2,
    nic_port_poll_s=0.5,
    signal_probe_s=0.2,
    held_claims_poll_s=0.2,
    held_pods_poll_s=0.2,
)
# The arguments of sys.executable that start `node-agent`, on production's times or SHORT
AGENT = ("-m", "agents.cli")
SHORT_AGENT = ("-m", "tests.timing")

if __name__ == "__main__":
    sys.exit(main(timing=SHORT))
