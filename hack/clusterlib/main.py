"""`hack/cluster_sim`: set the simulated cluster up, run the workload in each mode, print
the figures, and leave nothing of ours behind in the cluster."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hack.benchlib.figures import Figure, at_least, below, info, table
from hack.benchlib.main import machine
from hack.clusterlib import reach
from hack.clusterlib.accounting import COUNTS, Cluster
from hack.clusterlib.agents import AGENT, Agents
from hack.clusterlib.api import Api
from hack.clusterlib.layouts import cluster_layouts
from hack.clusterlib.modes import GRACE_S, ModeRun, Outcome
from hack.clusterlib.nodes import Nodes
from hack.clusterlib.state import State
from hack.clusterlib.workload import LABEL, ROOT, SHAPES, SWITCH, claim_template, device_classes

CLASSES = ("cluster-sim-gpu", "cluster-sim-nic")
ATTRIBUTE = {"switch": SWITCH, "root": ROOT}
REST_AFTER_S = 5.0
Progress = Callable[[str], None]


async def prepare(api: Api, namespace: str) -> None:
    """The namespace, our DeviceClasses, one claim template per shape and grouping."""
    await api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for cls in device_classes("cluster-sim"):
        await api.apply(cls)
    for shape in SHAPES:
        for grouping, attribute in ATTRIBUTE.items():
            name = f"{shape.name}-{grouping}"
            await api.apply(claim_template(name, shape, attribute, CLASSES), namespace)


async def clean(api: Api, namespace: str, nodes: Nodes | None) -> None:
    """Everything of ours: pods (at once), nodes, classes, rights, flow, namespace."""
    with contextlib.suppress(Exception):
        await api.delete_labelled("Pod", f"{LABEL}=true", namespace)
    if nodes is not None:
        await nodes.remove()
    await api.delete_labelled("Node", f"{LABEL}=true")
    for kind in ("DeviceClass", "ClusterRoleBinding", "ClusterRole", "FlowSchema"):
        await api.delete_labelled(kind, f"{LABEL}=true")
    await api.delete("Namespace", namespace)


async def simulate(opts: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    api = Api(opts.kubeconfig)
    layouts = {f"sim-{i:02d}": lay for i, lay in enumerate(cluster_layouts(opts.nodes))}
    cluster = Cluster(layouts)
    namespace = opts.namespace
    nodes: Nodes | None = None
    state: State | None = None
    agents: Agents | None = None
    start = time.monotonic()
    result: dict[str, Any] = {"nodes": opts.nodes, "seed": opts.seed, "operations": opts.operations}
    with tempfile.TemporaryDirectory(prefix="cluster-sim-") as scratch:
        tmp = opts.keep or Path(scratch)
        await asyncio.to_thread(tmp.mkdir, parents=True, exist_ok=True)
        try:
            await clean(api, namespace, None)
            await wait_gone(api, namespace)
            await prepare(api, namespace)
            nodes = Nodes(api, layouts)
            await nodes.create()
            agents = Agents(api, namespace, tmp, opts.agent)
            await agents.setup()
            progress(f"{opts.nodes} agents starting")
            before = await agents.requests()
            await agents.start(layouts)
            result["published_s"] = await agents.published(layouts, 120)
            result["start_requests"] = await agents.requests() - before
            state = State(api, namespace)
            await state.start()
            # The reporter sets the node's condition SETTLE_S after start: not at rest yet.
            await asyncio.sleep(REST_AFTER_S)
            progress(f"at rest for {opts.rest_s:g} s")
            before = await agents.requests()
            await asyncio.sleep(opts.rest_s)
            rest = await agents.requests() - before
            result["rest"] = {"requests": rest, "seconds": opts.rest_s}
            before, churn_start = await agents.requests(), time.monotonic()
            for grouping in ("switch", "root"):
                progress(f"DRA, pairs by {grouping}: {opts.operations} operations")
                out = await ModeRun(api, state, cluster, namespace, grouping).run(
                    opts.seed, opts.operations
                )
                result[grouping] = out
                agents.check_alive()
            churn = await agents.requests() - before
            result["churn"] = {"requests": churn, "seconds": time.monotonic() - churn_start}
            await agents.stop(layouts)
            result["agent_log"] = agents.log_warnings()
            progress(f"device plugins' counts: {opts.operations} operations")
            await nodes.counts(True)
            result[COUNTS] = await ModeRun(api, state, cluster, namespace, COUNTS).run(
                opts.seed, opts.operations
            )
        finally:
            if state is not None:
                await state.stop()
            if agents is not None:
                await agents.stop(layouts)
            await clean(api, namespace, nodes)
            await api.close()
    result["wall_s"] = time.monotonic() - start
    return result


async def wait_gone(api: Api, namespace: str, within: float = 120) -> None:
    """A namespace of an earlier run is deleted asynchronously: wait for it to go."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        names = {n["metadata"]["name"] for n in (await api.client.list("/api/v1/namespaces")).items}
        if namespace not in names:
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"namespace {namespace} still there after {within:g} s")


def percentile(values: Sequence[float], q: int) -> float:
    if not values:
        return float("nan")
    return (
        statistics.quantiles(values, n=100, method="inclusive")[q - 1]
        if len(values) > 1
        else values[0]
    )


def figures(result: dict[str, Any]) -> list[Figure]:
    n = result["nodes"]
    ops = result["operations"]
    out = [
        at_least("simulated nodes", n, "", 16),
        at_least(
            "operations per mode",
            ops,
            "",
            300,
            f"creations and deletions, seed {result['seed']}, the same sequence in every mode",
        ),
        below("wall time, all modes", result["wall_s"], "s", 600),
        info(
            "slices of every node published",
            result["published_s"],
            "s",
            f"after the agents were started; {result['start_requests']} API requests of the "
            f"{n} agents until then",
        ),
    ]
    for grouping, label in (
        ("switch", "DRA by pcieSwitch"),
        ("root", "DRA by pcieRoot only"),
        (COUNTS, "device plugins (counts)"),
    ):
        o: Outcome = result[grouping]
        rate = 100 * o.paired / o.pair_pods if o.pair_pods else float("nan")
        detail = (
            f"{o.paired}/{o.pair_pods} pods asking 1, 2 or 4 pairs got every GPU with a NIC "
            f"on its PCIe switch; {o.gpu_pods} GPU-only pods placed; {o.deleted} deletions"
        )
        if grouping == "switch":
            out.append(at_least(f"{label}: pair pods paired", rate, "%", 100, detail))
        else:
            out.append(info(f"{label}: pair pods paired", rate, "%", detail))
        if grouping == COUNTS:
            share = 100 * o.paired_on_node / o.pairable_on_node if o.pairable_on_node else 0.0
            out.append(
                info(
                    f"{label}: paired where the scheduler's node had the pairs free",
                    share,
                    "%",
                    f"{o.paired_on_node}/{o.pairable_on_node}: the agent's choice on the node; "
                    f"the other {o.pair_pods - o.pairable_on_node} pair pods landed on a node "
                    "without enough free pairs (the scheduler counts only)",
                )
            )
        waits = o.free_waits
        out.append(
            below(
                f"{label}: pods Unschedulable while a node had their devices free",
                len(o.pending_while_free),
                "pods",
                1,
                f"left Unschedulable > {GRACE_S:g} s while some node's free devices met "
                "the request; "
                f"{len(o.ever_unschedulable)} pods were Unschedulable at some point; "
                f"{len(waits)} waited with a fit free, longest {max(waits, default=0):.2f} s",
            )
        )
        lat = [1000 * x for x in o.latencies]
        what = "claim allocated" if grouping != COUNTS else "pod bound"
        out.append(info(f"{label}: creation to {what} p50", percentile(lat, 50), "ms"))
        out.append(
            info(
                f"{label}: creation to {what} p99",
                percentile(lat, 99),
                "ms",
                "includes pods that waited for a deletion",
            )
        )
        first = [1000 * x for x in o.first_try]
        out.append(
            info(
                f"{label}: creation to {what} p50/p99, pods never Unschedulable",
                percentile(first, 50),
                "ms",
                f"p99 {percentile(first, 99):.0f} ms over {len(first)} pods",
            )
        )
        out.append(info(f"{label}: wall time", o.wall_s, "s"))
    warnings = result.get("agent_log", {})
    out.append(
        info(
            "agent log warnings and errors",
            sum(warnings.values()),
            "",
            ", ".join(f"{k} x{v}" for k, v in sorted(warnings.items())) or "none",
        )
    )
    for key, label in (("rest", "at rest"), ("churn", "under churn (both DRA modes)")):
        r = result[key]
        per = r["requests"] / n / (r["seconds"] / 60)
        out.append(
            info(
                f"agent API requests per agent per minute, {label}",
                per,
                "",
                f"{r['requests']} requests of {n} agents in {r['seconds']:.0f} s, "
                "counted by the API server (the agents' own FlowSchema)",
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/cluster_sim", description=__doc__)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--operations", type=int, default=300, help="per mode")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--rest-s",
        type=float,
        default=300.0,
        help="the at-rest window (default 300: each of an agent's watches is opened again "
        "every 300 s)",
    )
    parser.add_argument("--namespace", default="cluster-sim")
    parser.add_argument("--kubeconfig", type=Path, help="the cluster (default: KUBECONFIG)")
    parser.add_argument("--agent", default=AGENT, help="the agent's command line, before its flags")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--keep", type=Path, help="keep the agents' logs and layouts here")
    opts = parser.parse_args(argv)
    opts.kubeconfig = opts.kubeconfig or reach.kubeconfig()

    def progress(step: str) -> None:
        print(f"cluster_sim: {step} ...", file=sys.stderr, flush=True)

    result = asyncio.run(simulate(opts, progress))
    figs = figures(result)
    if opts.json:
        detail = {k: v.summary() if isinstance(v, Outcome) else v for k, v in result.items()}
        doc = {"machine": machine(), "figures": [asdict(f) for f in figs], "runs": detail}
        print(json.dumps(doc, indent=2))
    else:
        print(table(figs))
    return 0 if all(f.ok is not False for f in figs) else 1
