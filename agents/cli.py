"""`node-agent`: argv, environment, logging and signals; the only place that touches them
(with agents/command_line.py, which parses argv and reads the flags' environment)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from agents.command_line import parse_args
from agents.config import Config, load_config
from agents.errors import AgentError, ConfigError
from agents.tasks import cause, until
from agents.timing import PRODUCTION, Timing

if TYPE_CHECKING:
    from agents.backends import Backends
    from agents.cluster.node_labeller import NodeLabeller
    from agents.daemon import Agent, HealthReporter
    from agents.family import AnyKind
    from agents.kernel.runtime import Api
    from agents.nodeconfig import NodeConfigs

EXIT_OK, EXIT_FATAL, EXIT_USAGE = 0, 1, 2
FREEZE_AFTER_S = 1.0  # the start-up heap is frozen this long after the agent has started

log = structlog.get_logger("node_agent")


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
        cache_logger_on_first_use=True,
    )


def main(
    argv: Sequence[str] | None = None,
    timing: Timing = PRODUCTION,
    apis: Sequence[Api] | None = None,
) -> int:
    """`node-agent ARGV`; `timing` and `apis` are no flags: tests start the agent on short
    times, or with an API of their own beside agents/apis.py's."""
    opts = parse_args(argv, apis)
    opts.timing = timing
    try:
        if opts.command == "run":
            configure_logging(
                opts.log_format, logging.getLevelNamesMapping()[opts.log_level.upper()]
            )
            return _run(opts)
        configure_logging("console", logging.ERROR)
        if opts.command == "topo":
            from agents.topo import show_topology

            return asyncio.run(
                show_topology(
                    opts.simulate,
                    opts.config,
                    as_json=opts.json,
                    lldp_wait_s=opts.lldp_wait,
                    plugins_dir=opts.kubelet_plugins_dir,
                )
            )
        if opts.command == "fabric":
            from agents.fabric import show_fabric

            return asyncio.run(show_fabric(opts.kubeconfig, opts.format, os.environ))
        from agents.demo import run_demo

        return asyncio.run(run_demo())
    except ConfigError as exc:
        print(f"node-agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except AgentError as exc:
        print(f"node-agent: {exc}", file=sys.stderr)
        return EXIT_FATAL


def _read_config(path: Path | None) -> Config:
    config = load_config(path) if path else Config.default()
    for key in config.ignored_keys:
        log.warning("config_key_ignored", key=key, reason="accepted for compatibility, no effect")
    return config


def _run(opts: argparse.Namespace) -> int:
    # Start-up builds objects that live as long as the process (modules, gRPC, devices):
    # collecting while it runs finds nothing and costs about a tenth of the time to
    # registered. Collection is on again once the start-up heap is frozen, or on return.
    gc.disable()
    try:
        return _run_agent(opts)
    finally:
        gc.enable()


def _run_agent(opts: argparse.Namespace) -> int:
    from agents.families import parse_families

    # Until the event loop handles it, a SIGHUP must not end the process (exit 129).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    # With --config-dir the config is chosen by the node's label, read once the loop runs.
    config = None if opts.config_dir else _read_config(opts.config)
    kinds = parse_families(opts.families)
    source = str(opts.config) if opts.config else "<defaults>"
    try:
        return asyncio.run(_serve(opts, config, source, kinds))
    except AgentError:
        raise
    except Exception:
        log.exception("agent_failed")
        return EXIT_FATAL


async def _serve(
    opts: argparse.Namespace, config: Config | None, source: str, kinds: Sequence[AnyKind]
) -> int:
    if config is not None:
        return await _serve_config(opts, config, source, kinds, None)
    from agents.nodeconfig import NodeConfigs, node_api

    api = await node_api(opts.kubeconfig, opts.node_name, os.environ)
    configs = NodeConfigs(opts.config_dir, opts.config_default, opts.config_label, api)
    try:
        chosen = await configs.start()
        return await _serve_config(opts, chosen.config, configs.source(chosen.file), kinds, configs)
    finally:
        await configs.aclose()


async def _serve_config(
    opts: argparse.Namespace,
    config: Config,
    source: str,
    kinds: Sequence[AnyKind],
    configs: NodeConfigs | None,
) -> int:
    from agents.backends import real_backends, simulated_backends
    from agents.daemon import Agent

    stop, hup = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, hup.set)
    backends_cm: contextlib.AbstractAsyncContextManager[Backends] = (
        simulated_backends(opts.simulate, opts.simulate_root)
        if opts.simulate
        else contextlib.nullcontext(real_backends())
    )
    reporter = await _cluster_reporter(opts)
    labeller = await _node_labeller(opts) if opts.label_node else None
    from agents.apis import api_named

    api = api_named(opts.api, opts.apis)
    serve = await api.serve(opts, os.environ)
    async with backends_cm as backends:
        agent = Agent(
            config,
            source,
            serve,
            backends,
            kinds,
            metrics_address=opts.metrics_address,
            nfd_features_file=opts.nfd_features_file,
            reporter=reporter,
            leftovers=[other.leftovers(opts) for other in opts.apis if other is not api],
            node_labeller=labeller,
            timing=opts.timing,
            pod_resources_socket=opts.pod_resources_socket,
        )

        def reloads() -> Coroutine[None, None, None]:
            if configs is None:
                return _reload_on(hup, agent, opts.config)
            return configs.run(agent, hup)

        # Start-up too ends at SIGTERM: discovery runs off the loop, so a hung NVML
        # initialisation holds up neither the signal nor the exit.
        await until(stop, lambda: _serve_agent(agent, reloads))
    log.info("agent_stopped")
    return EXIT_OK


async def _serve_agent(agent: Agent, reloads: Callable[[], Coroutine[None, None, None]]) -> None:
    """Start the agent, then serve it and apply config changes (SIGHUP, a node's label)."""
    await agent.start()
    # After the plugins have registered, not before: a full collection takes 5-10 ms.
    asyncio.get_running_loop().call_later(FREEZE_AFTER_S, _freeze_heap)
    log.info("agent_started", families=[k.name for k in agent.kinds])
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(agent.serve())
            group.create_task(reloads())
    except BaseExceptionGroup as failed:
        raise cause(failed) from None


async def _cluster_reporter(opts: argparse.Namespace) -> HealthReporter | None:
    from agents.cluster import cluster_reporter  # only here: never in the RPC path

    return await cluster_reporter(opts.kubeconfig, opts.node_name, os.environ)


async def _node_labeller(opts: argparse.Namespace) -> NodeLabeller | None:
    from agents.cluster import node_labeller  # only here: never in the RPC path

    return await node_labeller(opts.kubeconfig, opts.node_name, os.environ)


def _freeze_heap() -> None:
    """Keep what start-up built (modules, gRPC, config, devices) out of the collector's
    reach: it lives as long as the process, and a full collection that walks it stops
    the event loop for about 10 ms, an RPC answer with it, where a collection of what
    was made since costs well under 1 ms."""
    gc.collect()
    gc.freeze()
    gc.enable()  # off since start-up began (_run)


async def _reload_on(hup: asyncio.Event, agent: Agent, path: Path | None) -> None:
    """On each SIGHUP read the config file again and apply it; a bad one changes nothing."""
    while True:
        await hup.wait()
        hup.clear()
        source = str(path) if path else "<defaults>"
        log.info("config_reload", signal="SIGHUP", source=source)
        try:
            config = await asyncio.to_thread(_read_config, path)
            await agent.reload(config)
        except AgentError as exc:
            log.error("config_reload_refused", source=source, error=str(exc), kept="running config")


if __name__ == "__main__":
    sys.exit(main())
