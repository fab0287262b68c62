"""The agent's reports to the Kubernetes API server: never imported by the
RPC or health path, only by the command line that wires a reporter in; the API client
(and its HTTP library) only once there is an API server to report to."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from agents.cluster.access import Access, from_kubeconfig, in_cluster
from agents.errors import AgentError, ConfigError

if TYPE_CHECKING:
    from agents.cluster.node_labeller import NodeLabeller
    from agents.cluster.reporter import Reporter

log = structlog.get_logger(__name__)

NODE_NAME_ENV = "NODE_NAME"


async def cluster_reporter(
    kubeconfig: Path | None, node_name: str | None, env: Mapping[str, str]
) -> Reporter | None:
    """The reporter for this node, or None (said in one log line) when the node's name or
    the API server is unknown: the device plugins serve either way."""
    node = this_node(node_name, env)
    if not node:
        log.info("cluster_reports_off", reason=f"no node name: env {NODE_NAME_ENV} or --node-name")
        return None
    try:
        access = await api_access(kubeconfig, env)
    except (AgentError, OSError, ValueError) as exc:
        log.warning("cluster_reports_off", reason=str(exc), effect="device plugins keep serving")
        return None
    if access is None:
        log.info("cluster_reports_off", reason="no API access: not in a pod and no --kubeconfig")
        return None
    from agents.cluster.client import ApiClient
    from agents.cluster.reporter import Reporter

    return Reporter(node, ApiClient(access))


async def node_labeller(
    kubeconfig: Path | None, node_name: str | None, env: Mapping[str, str]
) -> NodeLabeller | None:
    """`--label-node`'s labeller for this node, or None (said in one log line) when the
    node's name or the API server is unknown: the labels then reach the Node through the
    feature file alone, and the device plugins serve either way."""
    node = this_node(node_name, env)
    if not node:
        log.warning(
            "node_labels_off",
            reason=f"--label-node without a node name: env {NODE_NAME_ENV} or --node-name",
            effect="fabric labels in the feature file only; device plugins keep serving",
        )
        return None
    try:
        access = await api_access(kubeconfig, env)
    except (AgentError, OSError, ValueError) as exc:
        access, reason = None, f"API server access: {exc}"
    else:
        reason = "no API access: not in a pod and no --kubeconfig"
    if access is None:
        log.warning(
            "node_labels_off",
            reason=reason,
            effect="fabric labels in the feature file only; device plugins keep serving",
        )
        return None
    from agents.cluster.client import ApiClient
    from agents.cluster.node_labeller import NodeLabeller

    return NodeLabeller(node, ApiClient(access))


async def required_access(flag: str, kubeconfig: Path | None, env: Mapping[str, str]) -> Access:
    """The API server for `flag`, which cannot do without it. ConfigError naming `flag`
    when there is none or it is unusable."""
    try:
        access = await api_access(kubeconfig, env)
    except (AgentError, OSError, ValueError) as exc:
        raise ConfigError(flag, "--kubeconfig", f"API server access: {exc}") from exc
    if access is None:
        raise ConfigError(flag, "--kubeconfig", "API server access (or run in a pod)")
    return access


def this_node(node_name: str | None, env: Mapping[str, str]) -> str | None:
    """The node's name: env NODE_NAME, else --node-name."""
    return env.get(NODE_NAME_ENV) or node_name


async def api_access(kubeconfig: Path | None, env: Mapping[str, str]) -> Access | None:
    """The API server from --kubeconfig, else the pod's service account; None when
    neither. Raises AgentError, OSError or ValueError for an unusable one."""
    if kubeconfig is not None:
        return await asyncio.to_thread(from_kubeconfig, kubeconfig)
    return await asyncio.to_thread(in_cluster, env)


__all__ = ["NODE_NAME_ENV", "api_access", "cluster_reporter", "node_labeller", "this_node"]
