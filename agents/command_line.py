"""The command line of `node-agent`: its commands, their flags and the environment
variables that give flags their defaults, parsed into one namespace (agents/cli.py runs
what it says)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from agents import __version__
from agents.core.config_choice import DEFAULT_LABEL
from agents.dra.api import DEFAULT_KUBELET_PLUGINS_DIR

if TYPE_CHECKING:
    from agents.kernel.runtime import Api

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
PLUGIN_DIR_ENV = "NODE_AGENT_DEVICE_PLUGIN_DIR"
POD_RESOURCES_ENV = "NODE_AGENT_POD_RESOURCES_SOCKET"
API_ENV = "NODE_AGENT_API"
CONFIG_DIR_ENV = "NODE_AGENT_CONFIG_DIR"
CONFIG_DEFAULT_ENV = "NODE_AGENT_CONFIG_DEFAULT"
CONFIG_LABEL_ENV = "NODE_AGENT_CONFIG_LABEL"
LOG_LEVEL_ENV = "NODE_AGENT_LOG_LEVEL"
LOG_LEVELS = ("debug", "info", "warning", "error")

DEFAULT_LLDP_WAIT_S = 31.0  # switches and lldpd send LLDP every 30 s
SIMULATE_HELP = "simulated node file, or the name of a bundled one (e.g. h100-8gpu-8nic)"


def _node_file(arg: str) -> Path:
    """A node file path; a name that is no file means the bundled node of that name, and
    is a usage error listing the bundled nodes if there is none."""
    path = Path(arg)
    if path.exists() or os.sep in arg:
        return path
    from agents.sim.bundled import bundled_node, bundled_nodes

    stem = arg.removesuffix(".yaml")
    names = bundled_nodes()
    if stem not in names:
        raise argparse.ArgumentTypeError(
            f"{arg}: no such file, nor a bundled node (bundled: {', '.join(names)})"
        )
    return bundled_node(stem)


def _seconds(arg: str) -> float:
    """A duration in seconds, 0 or more."""
    try:
        value = float(arg)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{arg!r}: seconds, 0 or more")
    return value


def build_parser(apis: Sequence[Api] | None = None) -> argparse.ArgumentParser:
    """The command line of `node-agent`; --api chooses among `apis` (None: agents/apis.py's)."""
    parser = argparse.ArgumentParser(
        prog="node-agent", description="Kubernetes device-plugin agents for GPUs and RoCE NICs."
    )
    parser.add_argument("--version", action="version", version=f"node-agent {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="run, topo, demo or fabric"
    )
    run = sub.add_parser("run", help="serve the devices until SIGTERM")
    run.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="configuration file (YAML); SIGHUP reads it again",
    )
    _config_dir_flags(run)
    run.add_argument(
        "--device-plugin-dir",
        type=Path,
        metavar="DIR",
        default=Path(os.environ.get(PLUGIN_DIR_ENV, DEFAULT_PLUGIN_DIR)),
        help=f"the kubelet's device-plugin directory (env {PLUGIN_DIR_ENV}; "
        f"default {DEFAULT_PLUGIN_DIR})",
    )
    run.add_argument("--simulate", type=_node_file, metavar="NODE.yaml", help=SIMULATE_HELP)
    run.add_argument(
        "--simulate-root",
        type=lambda arg: Path(arg).absolute(),
        metavar="DIR",
        help="make the simulated node's tree and device nodes under DIR (created if missing), "
        "so that device paths given to the kubelet exist there; in a pod, a hostPath at the "
        "same path (default: a fresh temporary directory; only with --simulate)",
    )
    run.add_argument("--families", metavar="gpu,roce", help="families to run (default all)")
    run.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        help="serve Prometheus /metrics and /healthz here (default: off)",
    )
    run.add_argument(
        "--nfd-features-file",
        type=Path,
        metavar="PATH",
        help="write node labels as a feature file at PATH",
    )
    run.add_argument(
        "--pod-resources-socket",
        type=Path,
        metavar="PATH",
        default=Path(os.environ.get(POD_RESOURCES_ENV, DEFAULT_POD_RESOURCES_SOCKET)),
        help="the kubelet's pod-resources socket, used for pairing when it answers "
        f"(env {POD_RESOURCES_ENV}; default {DEFAULT_POD_RESOURCES_SOCKET})",
    )
    _cluster_flags(run)
    _api_flags(run, _apis(apis))
    run.add_argument(
        "--log-format",
        choices=("json", "console"),
        default="console",
        help="log lines as JSON objects or as console text (default console)",
    )
    run.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default=os.environ.get(LOG_LEVEL_ENV, "info"),
        help=f"the least severe events logged (env {LOG_LEVEL_ENV}; default info)",
    )
    topo = sub.add_parser("topo", help="devices, GPU<->NIC pairs and the distance matrix")
    topo.add_argument("--simulate", type=_node_file, metavar="NODE.yaml", help=SIMULATE_HELP)
    topo.add_argument("--config", type=Path, metavar="FILE", help="configuration file (YAML)")
    topo.add_argument("--json", action="store_true", help="machine-readable output")
    topo.add_argument(
        "--lldp-wait",
        type=_seconds,
        metavar="S",
        default=DEFAULT_LLDP_WAIT_S,
        help="listen up to S seconds for LLDP on the RoCE NICs' netdevs to show the leaf "
        "switch each is cabled to, stopping once every NIC has heard (needs CAP_NET_RAW; "
        f"default {DEFAULT_LLDP_WAIT_S:g}: switches send every 30 s; 0: do not listen). "
        "topo listens itself: it does not ask a running agent",
    )
    topo.add_argument(
        "--kubelet-plugins-dir",
        type=Path,
        metavar="DIR",
        default=Path(DEFAULT_KUBELET_PLUGINS_DIR),
        help="DRA: where the GPU driver's checkpoint of prepared claims is read, to show "
        f"each GPU's shares (as `run`'s flag; default {DEFAULT_KUBELET_PLUGINS_DIR})",
    )
    sub.add_parser("demo", help="a guided run on a bundled simulated 8-GPU, 8-NIC node")
    fabric = sub.add_parser("fabric", help="the cluster's leaf groups and spines, from Node labels")
    fabric.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="the cluster's API server (default: the pod's service account)",
    )
    fabric.add_argument(
        "--format",
        choices=("table", "kueue", "volcano"),
        default="table",
        help="a table with node counts, a Kueue Topology or Volcano HyperNodes (YAML)",
    )
    return parser


def _config_dir_flags(run: argparse.ArgumentParser) -> None:
    """A config per node (docs/configuration.md): named configs, the node's label choosing."""
    run.add_argument(
        "--config-dir",
        type=Path,
        metavar="DIR",
        help="a directory of named configs, one file each (a mounted ConfigMap); the node's "
        "label chooses one, applied again when the label or the directory changes "
        f"(env {CONFIG_DIR_ENV}; not with --config)",
    )
    run.add_argument(
        "--config-default",
        metavar="NAME",
        help=f"with --config-dir: the config of a node without the label (env "
        f"{CONFIG_DEFAULT_ENV}; default: the config named default, else the only one, "
        "else the built-in defaults)",
    )
    run.add_argument(
        "--config-label",
        metavar="KEY",
        help=f"with --config-dir: the node label that names the config (env "
        f"{CONFIG_LABEL_ENV}; default {DEFAULT_LABEL})",
    )


def _config_dir_args(run: argparse.ArgumentParser, opts: argparse.Namespace) -> None:
    """--config-dir and its two companions, from the command line, else the environment."""
    env: Mapping[str, str] = os.environ
    given = [f"--config-{f}" for f in ("default", "label") if getattr(opts, f"config_{f}")]
    if opts.config_dir is None and env.get(CONFIG_DIR_ENV):
        opts.config_dir = Path(env[CONFIG_DIR_ENV])
    if opts.config is not None and opts.config_dir is not None:
        run.error(f"--config and --config-dir (env {CONFIG_DIR_ENV}): one or the other")
    if given and opts.config_dir is None:
        run.error(f"{given[0]}: only with --config-dir")
    opts.config_default = opts.config_default or env.get(CONFIG_DEFAULT_ENV) or None
    opts.config_label = opts.config_label or env.get(CONFIG_LABEL_ENV) or DEFAULT_LABEL


def _cluster_flags(run: argparse.ArgumentParser) -> None:
    """Where the API server is told of device faults (docs/architecture.md)."""
    run.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="API server for device-fault Events and the DevicesHealthy and DevicesDegraded "
        "conditions, when not in a pod (default: the pod's service account)",
    )
    run.add_argument(
        "--node-name",
        metavar="NAME",
        help="this node's name in the cluster (env NODE_NAME, which takes precedence)",
    )
    run.add_argument(
        "--label-node",
        action="store_true",
        help="also patch the labels this agent owns onto this node's Node: the fabric's "
        "(leaf group, spine) and GPU Feature Discovery's nvidia.com/ ones (needs patch on "
        "nodes; see docs/labels.md, docs/fabric.md)",
    )


def _api_flags(run: argparse.ArgumentParser, apis: Sequence[Api]) -> None:
    """The kubelet API the devices are served through (agents/apis.py), and each API's own
    flags."""
    names = tuple(api.name for api in apis)
    run.add_argument(
        "--api",
        choices=names,
        default=os.environ.get(API_ENV, names[0]),
        help=f"serve devices through {' or '.join(names)} (env {API_ENV}; "
        f"default {names[0]}); one API per node",
    )
    for api in apis:
        api.add_flags(run)


def _apis(given: Sequence[Api] | None) -> tuple[Api, ...]:
    from agents.apis import APIS

    return APIS if given is None else tuple(given)


def parse_args(argv: Sequence[str] | None, apis: Sequence[Api] | None = None) -> argparse.Namespace:
    """Parse argv; an unknown argument after a command gets that command's usage (exit 2).
    `apis`: those --api chooses among (None: agents/apis.py's); kept as `opts.apis`."""
    apis = _apis(apis)
    parser = build_parser(apis)
    args = sys.argv[1:] if argv is None else list(argv)
    # Before the command only --help and --version are known; argparse would only say
    # that the command is missing.
    before = next((i for i, arg in enumerate(args) if not arg.startswith("-")), len(args))
    unknown = [a for a in args[:before] if a not in ("-h", "--help", "--version")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    opts, extra = parser.parse_known_args(args)
    if extra:
        _subparser(parser, opts.command).error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(opts, "simulate_root", None) and not opts.simulate:
        _subparser(parser, "run").error("--simulate-root: only with --simulate")
    opts.apis = apis
    names = tuple(api.name for api in apis)
    if getattr(opts, "api", names[0]) not in names:
        _subparser(parser, "run").error(f"{API_ENV}: one of {', '.join(names)}, not {opts.api!r}")
    if getattr(opts, "log_level", "info") not in LOG_LEVELS:
        levels = ", ".join(LOG_LEVELS)
        _subparser(parser, "run").error(f"{LOG_LEVEL_ENV}: one of {levels}, not {opts.log_level!r}")
    if opts.command == "run":
        run = _subparser(parser, "run")
        for api in apis:  # each API checks its own flags
            error = api.flags_error(opts)
            if error is not None:
                run.error(error)
        _config_dir_args(run, opts)
    return opts


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    actions = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = next(actions).choices[command]
    return found
