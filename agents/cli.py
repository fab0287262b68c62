"""`node-agent`: argv, environment, logging and signals; the only place that touches them."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from agents.config import Config, load_config
from agents.errors import AgentError, ConfigError

if TYPE_CHECKING:
    from agents.daemon import Backends

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
PLUGIN_DIR_ENV = "NODE_AGENT_DEVICE_PLUGIN_DIR"
EXIT_OK, EXIT_FATAL, EXIT_USAGE = 0, 1, 2

log = structlog.get_logger("node_agent")

SIMULATE_HELP = "simulated node file, or the name of a bundled one (e.g. h100-8gpu-8nic)"


def _node_file(arg: str) -> Path:
    """A node file path; a name that is no file but a bundled node means that node."""
    path = Path(arg)
    if path.exists() or os.sep in arg:
        return path
    from agents.sim.bundled import bundled_node, bundled_nodes

    stem = arg.removesuffix(".yaml")
    return bundled_node(stem) if stem in bundled_nodes() else path


def configure_logging(fmt: str, level: int = logging.INFO) -> None:
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="node-agent", description="Kubernetes device-plugin agents for GPUs and RoCE NICs."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="serve the device plugins until SIGTERM")
    run.add_argument("--config", type=Path, help="configuration file (YAML)")
    run.add_argument(
        "--device-plugin-dir",
        type=Path,
        default=Path(os.environ.get(PLUGIN_DIR_ENV, DEFAULT_PLUGIN_DIR)),
        help=f"the kubelet's device-plugin directory (env {PLUGIN_DIR_ENV}; "
        f"default {DEFAULT_PLUGIN_DIR})",
    )
    run.add_argument("--simulate", type=_node_file, metavar="NODE.yaml", help=SIMULATE_HELP)
    run.add_argument("--families", default="gpu,roce", help="families to run (default gpu,roce)")
    run.add_argument("--metrics-address", metavar="HOST:PORT", help="serve Prometheus metrics")
    run.add_argument(
        "--nfd-features-file",
        type=Path,
        metavar="PATH",
        help="write node labels as a feature file at PATH",
    )
    run.add_argument("--log-format", choices=("json", "console"), default="console")
    topo = sub.add_parser("topo", help="devices, GPU<->NIC pairs and the distance matrix")
    topo.add_argument("--simulate", type=_node_file, metavar="NODE.yaml", help=SIMULATE_HELP)
    topo.add_argument("--config", type=Path, help="configuration file (YAML)")
    topo.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_parser("demo", help="a guided run on a bundled simulated 8-GPU, 8-NIC node")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    try:
        if opts.command == "run":
            configure_logging(opts.log_format)
            return _run(opts)
        configure_logging("console", logging.ERROR)
        if opts.command == "topo":
            from agents.topo import show_topology

            return asyncio.run(show_topology(opts.simulate, opts.config, as_json=opts.json))
        from agents.demo import run_demo

        return asyncio.run(run_demo())
    except ConfigError as exc:
        print(f"node-agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except AgentError as exc:
        print(f"node-agent: {exc}", file=sys.stderr)
        return EXIT_FATAL


def _run(opts: argparse.Namespace) -> int:
    from agents.daemon import parse_families

    config = load_config(opts.config) if opts.config else Config.default()
    families = parse_families(opts.families)
    for key in config.ignored_keys:
        log.warning("config_key_ignored", key=key, reason="accepted for compatibility, no effect")
    source = str(opts.config) if opts.config else "<defaults>"
    opts.device_plugin_dir.mkdir(parents=True, exist_ok=True)
    try:
        return asyncio.run(_serve(opts, config, source, families))
    except AgentError:
        raise
    except Exception:
        log.exception("agent_failed")
        return EXIT_FATAL


async def _serve(
    opts: argparse.Namespace, config: Config, source: str, families: tuple[str, ...]
) -> int:
    from agents.daemon import Agent, real_backends, simulated_backends

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    plugin_dir: Path = opts.device_plugin_dir
    backends_cm: contextlib.AbstractAsyncContextManager[Backends] = (
        simulated_backends(opts.simulate)
        if opts.simulate
        else contextlib.nullcontext(real_backends(config))
    )
    async with backends_cm as backends:
        agent = Agent(
            config,
            source,
            plugin_dir,
            backends,
            families,
            metrics_address=opts.metrics_address,
            nfd_features_file=opts.nfd_features_file,
        )
        agent.start()
        log.info("agent_started", plugin_dir=str(plugin_dir), families=list(families))
        await agent.run(stop)
    log.info("agent_stopped")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
