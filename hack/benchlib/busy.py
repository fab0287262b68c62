"""GetPreferredAllocation on partly occupied nodes, p50/p99/max: round trips over the
plugin's socket, the pure choice under the agent's time budget, the search without a
budget, and the plain enumeration over classes that it was measured against.

The round trips are wall-clock time, what the kubelet waits. The pure figures are the
thread's CPU time, with the budget read from the same clock: what the choice costs on a
machine of its own, whatever else competes for the CPUs while the bench runs."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from agents.api import podresources_pb2_grpc as pr_grpc
from agents.core import budget, pairing
from agents.standin.admission import AllocatedContainer, PodAllocation
from agents.standin.checkpoint import (
    CHECKPOINT_NAME,
    CheckpointEntry,
    checkpoint_data,
    write_checkpoint,
)
from agents.standin.podresources import listing_response
from hack.benchlib.agent import GPU, NIC, AgentProcess, Client, no_collection, percentile
from hack.benchlib.enumeration import enumerate_prefer
from hack.benchlib.figures import Figure, below, info
from hack.benchlib.nodes import generate_node, irregular_node, sharing_config, write_yaml
from hack.benchlib.occupied import Ask, Model, Workload, biggest, replicas_of

TARGET_P99_MS = 2.0
TARGET_MAX_MS = 10.0
WARMUP = 20
ENUMERATION_LIMIT = 100_000  # count vectors; past it the enumeration is not run
FLOOR = "floor"
# Shapes timed a second time with nothing answering on the pod-resources socket: the
# round trip without the query that pairing asks before a container's first resource.
WITHOUT_POD_RESOURCES = ("(8 GPUs, 8 NICs)", "(16 GPUs, 16 NICs)")


@dataclass(frozen=True)
class Shape:
    label: str
    doc: Mapping[str, Any]
    config: dict[str, Any] | None = None


def shapes() -> list[Shape]:
    return [
        Shape("(8 GPUs, 8 NICs)", generate_node(8, 8)),
        Shape("(8 GPUs, 16 NICs)", generate_node(8, 16)),
        Shape("(16 GPUs, 8 NICs)", generate_node(16, 8)),
        Shape("(16 GPUs, 16 NICs)", generate_node(16, 16)),
        Shape("(16 GPUs x8 replicas, 16 NICs)", generate_node(16, 16), sharing_config(8)),
        Shape("(32 GPUs, 16 NICs, irregular)", irregular_node(random.Random(5), 32, 16)),
        Shape("(32 GPUs, 32 NICs, irregular)", irregular_node(random.Random(6), 32, 32)),
    ]


@dataclass
class Pure:
    """Per resource: ms with the budget, ms without, and how the budget changed answers."""

    ms: dict[str, list[float]] = field(default_factory=lambda: {GPU: [], NIC: []})
    unbounded: dict[str, list[float]] = field(default_factory=lambda: {GPU: [], NIC: []})
    expired: dict[str, int] = field(default_factory=lambda: {GPU: 0, NIC: 0})
    changed: dict[str, int] = field(default_factory=lambda: {GPU: 0, NIC: 0})
    worse_pairing: dict[str, int] = field(default_factory=lambda: {GPU: 0, NIC: 0})
    enumerated: dict[str, list[float]] = field(default_factory=lambda: {GPU: [], NIC: []})
    too_many: dict[str, int] = field(default_factory=lambda: {GPU: 0, NIC: 0})
    most_ways: dict[str, int] = field(default_factory=lambda: {GPU: 0, NIC: 0})

    def calls(self) -> int:
        return sum(len(v) for v in self.ms.values())


def pure(model: Model, calls: int, seed: int, *, enumerate_too: bool) -> Pure:
    """Each call of a random workload three ways: the agent's choice under its budget
    (whose answer the workload goes on with), the same search without a budget, and
    the plain enumeration (paired resources only; checked to answer alike)."""
    out = Pure()
    seen = 0

    def choose(ask: Ask) -> list[str]:
        nonlocal seen
        if ask.resource == NIC and not model.paired:
            # Without pairing the NIC choice is a sort in the resource, no core search.
            return [*ask.must, *sorted(set(ask.available) - set(ask.must))][: ask.size]
        seen += 1
        counted = seen > WARMUP
        fired = []
        clock = budget.deadline(time.thread_time, budget.PREFERRED_ALLOCATION_S)

        def expired() -> bool:
            fired.append(clock())
            return fired[-1]

        started = time.thread_time()
        answer = model.choose(ask, expired)
        took = time.thread_time() - started
        started = time.thread_time()
        best = model.choose(ask)
        took_unbounded = time.thread_time() - started
        if counted:
            r = ask.resource
            out.ms[r].append(took * 1000)
            out.unbounded[r].append(took_unbounded * 1000)
            out.expired[r] += any(fired)
            out.changed[r] += answer != best
            if model.paired and answer != best:
                view = model.view(ask)
                out.worse_pairing[r] += pairing.score(answer, view) != pairing.score(best, view)
            if enumerate_too and model.paired:
                _enumerate(model, ask, best, out)
        return answer

    workload = Workload(model.devices, random.Random(seed), big=biggest(model))
    for _ in workload.admissions(choose):
        if out.calls() >= calls:
            break
    return out


def _enumerate(model: Model, ask: Ask, best: list[str], out: Pure) -> None:
    costs = model.costs[ask.resource]
    got = enumerate_prefer(
        ask.available, ask.must, ask.size, model.view(ask), costs, limit=ENUMERATION_LIMIT
    )
    out.most_ways[ask.resource] = max(out.most_ways[ask.resource], got.ways)
    if got.answer is None:
        out.too_many[ask.resource] += 1
        return
    if got.answer != best:
        raise AssertionError(f"enumeration and search disagree: {got.answer} vs {best}")
    out.enumerated[ask.resource].append(got.seconds * 1000)


class _Agent(AgentProcess):
    """The agent, asking pod-resources on a socket of the bench's own (or on one where
    nothing listens: the agent then pairs from the checkpoint alone)."""

    def __init__(self, work: Path, node: Path, config: Any, pod_resources: Path) -> None:
        super().__init__(work, node, config=config)
        self.pod_resources = pod_resources

    def command(self) -> list[str]:
        return [*super().command(), "--pod-resources-socket", str(self.pod_resources)]


class _Lister(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """The kubelet's pod-resources answer: every pod of the workload, the one being
    admitted with the devices it got so far; deleted pods are gone at once."""

    def __init__(self, pods: Callable[[], Mapping[str, Mapping[str, list[str]]]]) -> None:
        self._pods = pods

    def List(self, request: Any, context: Any) -> Any:  # noqa: N802 (the RPC name)
        return listing_response(
            PodAllocation(name, {"c": AllocatedContainer("c", dict(got))})
            for name, got in list(self._pods().items())
        )


def _pod_resources(socket: Path, workload: Workload) -> Any:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    pr_grpc.add_PodResourcesListerServicer_to_server(_Lister(lambda: workload.pods), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    socket.chmod(0o600)
    return server


def rpc(
    work: Path, shape: Shape, calls: int, seed: int, *, pod_resources: bool = True
) -> dict[str, list[float]]:
    """Round trips over the agent's sockets while a workload fills and empties the node:
    every answer is allocated, and after each container the checkpoint is renamed into
    place in the kubelet's own format and pod-resources answers what the kubelet would,
    as on a real node (unless `pod_resources` is False: then nothing listens on the
    agent's pod-resources socket). After each call, an empty GetDevicePluginOptions is
    timed too (`FLOOR`): what any round trip costs meanwhile."""
    model = Model(shape.doc, replicas=replicas_of(shape.config))
    node = write_yaml(work / "node.yaml", dict(shape.doc))
    workload = Workload(model.devices, random.Random(seed), big=biggest(model))
    socket = work / ("pod-resources.sock" if pod_resources else "nothing-listens.sock")
    lister = _pod_resources(socket, workload) if pod_resources else None
    agent = _Agent(work, node, shape.config, socket)
    agent.start()
    ms: dict[str, list[float]] = {GPU: [], NIC: [], FLOOR: []}
    try:
        agent.wait_serving([GPU, NIC])
        with (
            Client(agent.socket(GPU)) as gpu,
            Client(agent.socket(NIC)) as nic,
            no_collection(),
        ):
            clients = {GPU: gpu, NIC: nic}
            for resource, client in clients.items():
                if sorted(client.devices()) != model.devices[resource]:
                    raise AssertionError(f"{resource}: the agent serves other devices")
            seen = 0

            def choose(ask: Ask) -> list[str]:
                nonlocal seen
                client = clients[ask.resource]
                started = time.perf_counter()
                answer = client.preferred(ask.available, ask.must, ask.size)
                took = time.perf_counter() - started
                started = time.perf_counter()
                client.options()
                floor = time.perf_counter() - started
                seen += 1
                if seen > WARMUP:
                    ms[ask.resource].append(took * 1000)
                    ms[FLOOR].append(floor * 1000)
                client.allocate(answer)
                return answer

            checkpoint = agent.plugin_dir / CHECKPOINT_NAME
            for _ in workload.admissions(choose):
                entries = [
                    CheckpointEntry(pod, "c", resource, {-1: ids}, b"")
                    for pod, got in workload.pods.items()
                    for resource, ids in got.items()
                ]
                write_checkpoint(checkpoint, checkpoint_data(entries, model.devices))
                if len(ms[FLOOR]) >= calls:
                    break
    finally:
        agent.stop()
        if lister is not None:
            lister.stop(None)
    return ms


def busy_figures(root: Path, calls: int, enumerated: int, seed: int = 1) -> list[Figure]:
    """Every shape: RPC and pure rows against the targets, then the search without its
    budget and the plain enumeration, for the record."""
    figures: list[Figure] = []
    for n, shape in enumerate(shapes()):
        work = root / f"busy-{n}"
        work.mkdir()
        model = Model(shape.doc, replicas=replicas_of(shape.config))
        load = os.getloadavg()[0]
        by_rpc = rpc(work, shape, calls, seed)
        load = max(load, os.getloadavg()[0])
        measured = pure(model, calls, seed, enumerate_too=False)
        compared = pure(model, enumerated, seed, enumerate_too=True) if model.paired else None
        for resource in (GPU, NIC):
            name = f"GetPreferredAllocation busy {shape.label} {resource}"
            figures += _spread(
                f"{name} RPC", by_rpc[resource], f"load average up to {load:.1f} meanwhile"
            )
            if measured.ms[resource]:
                note = (
                    f"budget {budget.PREFERRED_ALLOCATION_S * 1000:g} ms expired in "
                    f"{measured.expired[resource]}/{len(measured.ms[resource])} calls, "
                    f"answer differs from the unbounded search in {measured.changed[resource]}"
                    f" (pairing score worse in {measured.worse_pairing[resource]}, "
                    "pair costs only in the others)"
                )
                figures += _spread(f"{name} pure CPU", measured.ms[resource], note)
                figures += _spread(f"{name} unbounded", measured.unbounded[resource], None)
            if compared is not None:
                figures += _comparison(name, compared, resource)
        figures += _spread(
            f"GetDevicePluginOptions (empty) busy {shape.label} RPC", by_rpc[FLOOR], None
        )
        if shape.label in WITHOUT_POD_RESOURCES:
            (root / f"busy-{n}-alone").mkdir()
            alone = rpc(root / f"busy-{n}-alone", shape, calls, seed, pod_resources=False)
            for resource in (GPU, NIC):
                figures += _spread(
                    f"GetPreferredAllocation busy {shape.label} {resource} RPC, "
                    "agent without pod-resources",
                    alone[resource],
                    None,
                )
    return figures


def _spread(name: str, ms: list[float], note: str | None) -> list[Figure]:
    """p50, p99 and max; against the targets unless `note` is None (for the record)."""
    if not ms:
        return []
    p50, p99, top = percentile(ms, 50), percentile(ms, 99), max(ms)
    detail = f"{len(ms)} calls{'; ' + note if note else ''}"
    if note is None:
        return [info(f"{name} p50/p99/max", p99, "ms", f"{p50:.2f} / {p99:.2f} / {top:.2f} ms")]
    return [
        info(f"{name} p50", p50, "ms"),
        below(f"{name} p99", p99, "ms", TARGET_P99_MS, detail),
        below(f"{name} max", top, "ms", TARGET_MAX_MS),
    ]


def _comparison(name: str, compared: Pure, resource: str) -> list[Figure]:
    bb, enum = compared.unbounded[resource], compared.enumerated[resource]
    if not bb:
        return []
    left_out = compared.too_many[resource]
    note = (
        f"{len(enum)} calls; branch and bound on the same calls "
        f"{percentile(bb, 50):.2f} / {percentile(bb, 99):.2f} / {max(bb):.2f} ms; "
        f"{left_out} calls left out with more than {ENUMERATION_LIMIT} ways "
        f"(up to {compared.most_ways[resource]})"
    )
    if not enum:
        return [info(f"{name} enumeration p50/p99/max", float("nan"), "ms", note)]
    p50, p99, top = percentile(enum, 50), percentile(enum, 99), max(enum)
    return [
        info(
            f"{name} enumeration p50/p99/max",
            p99,
            "ms",
            f"{p50:.2f} / {p99:.2f} / {top:.2f} ms over {note}",
        )
    ]
