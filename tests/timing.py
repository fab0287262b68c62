"""Hold times and probe periods short enough for a test to wait out: the agent's own code,
on times a tenth or less of production's (agents.timing). Run as a module
(`python -m tests.timing run ...`) it is `node-agent` on them, for tests that start the
agent as a process."""

from __future__ import annotations

import sys

from agents.cli import main
from agents.timing import Timing

SHORT = Timing(
    gpu_hold_s=0.3,
    gpu_probe_s=0.2,
    gpu_event_wait_s=1.0,
    nic_flap_hold_s=0.2,
    nic_port_poll_s=0.5,
    signal_probe_s=0.2,
)
# The arguments of sys.executable that start `node-agent`, on production's times or SHORT
AGENT = ("-m", "agents.cli")
SHORT_AGENT = ("-m", "tests.timing")

if __name__ == "__main__":
    sys.exit(main(timing=SHORT))
