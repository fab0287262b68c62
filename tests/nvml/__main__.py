"""Build the test NVML library and write a node's state file, for a run by hand:

    eval "$(python -m tests.nvml h100 /tmp/nvml.state)"   # or a100-mixed, or NODE.yaml
    node-agent run --families gpu --device-plugin-dir /tmp/dp

NODE is a GPU profile (a100 b200 gb200 gb300 h100 l40s t4), a MIG layout (a100-mixed,
h100-uniform) or a simulated node file. Prints the shell exports that make pynvml load it.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from agents.sim.node import load_node
from tests.nvml.library import STATE_ENV, build
from tests.nvml.nodes import MIG_LAYOUTS, PROFILES, from_profile, from_sim_node, with_mig


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    name, out = argv[0], Path(argv[1]).resolve()
    if name in PROFILES:
        node = from_profile(name)
    elif name in MIG_LAYOUTS:
        node = with_mig(name)
    else:
        node = from_sim_node(load_node(Path(name)))
    node.write(out)
    print(f"export LD_LIBRARY_PATH={shlex.quote(str(build()))}")
    print(f"export {STATE_ENV}={shlex.quote(str(out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
