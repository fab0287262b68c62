"""Acceptance (docs/configuration.md): each config of the corpus, written in NVIDIA's device-plugin
format, registers what its case says and Allocate answers as its case says, with the
agent on a simulated node and the kubelet stand-in; refused ones fail at start."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog

from agents.config import parse_config
from agents.errors import ConfigError
from agents.standin.kubelet import AdmissionError, Container, Kubelet, Pod
from tests.compat.corpus import (
    REFUSED,
    SERVED,
    Case,
    NodeNames,
    answer_fields,
    expected_fields,
    simulator_root,
    unordered,
)
from tests.integration.gpu_agent import CONFIG_SOURCE, running_agent


async def check_allocations(case: Case, kubelet: Kubelet, sim_root: str | None) -> None:
    """Admit the case's pods one by one and compare every answer with its expectation.
    `sim_root` None: the agent runs elsewhere, its simulator root is read off the answer."""
    names = NodeNames(case.node_file)
    used: set[str] = set()
    for n, request in enumerate(case.allocate):
        pod = Pod(f"pod-{n}", [Container("c", {request.resource: request.count})])
        if request.refused is not None:
            with pytest.raises(AdmissionError, match=request.refused):
                await kubelet.admit(pod)
            continue
        got = await kubelet.admit(pod)
        ids = got.devices("c", request.resource)
        assert len(ids) == request.count
        used.update(names.gpus(ids))
        if case.expect is None:
            continue
        told = names.told(ids, case.expect["told"])
        minors = [names.minor[g] for g in names.gpus(ids)]
        got_fields = answer_fields(got.containers["c"].responses[request.resource])
        root = sim_root if sim_root is not None else simulator_root(got_fields)
        want = expected_fields(case.expect, told, minors, root)
        assert unordered(got_fields) == unordered(want), ids
    if case.gpus_used is not None:
        assert len(used) == case.gpus_used, sorted(used)


def check_device_ids(case: Case, kubelet: Kubelet) -> None:
    """`ids: uuid`: every advertised device is named by its GPU or MIG UUID."""
    if case.ids is None:
        return
    names = NodeNames(case.node_file)
    for resource in case.registered:
        view = kubelet.resource(resource)
        assert view is not None
        assert {NodeNames.base(d) for d in view.devices} <= set(names.uuid), resource


def warnings_of(logs: Sequence[Mapping[str, Any]], event: str) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["event"] == event and e["log_level"] == "warning"]


@pytest.mark.parametrize("case", SERVED, ids=[c.name for c in SERVED])
async def test_config_registers_and_allocates_as_its_case_says(case: Case, tmp_path: Path) -> None:
    text = case.config.read_text()
    assert parse_config(text, CONFIG_SOURCE).ignored_keys == case.ignored
    with structlog.testing.capture_logs() as logs:
        async with running_agent(tmp_path, text, node=case.node_file) as run:
            await run.registered(case.registered)
            check_device_ids(case, run.kubelet)
            await check_allocations(case, run.kubelet, str(run.sim.dev_root))
    for event in case.logged:
        assert len(warnings_of(logs, event)) == 1, event


@pytest.mark.parametrize("case", REFUSED, ids=[c.name for c in REFUSED])
async def test_config_is_refused_naming_the_key_and_what_was_expected(
    case: Case, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as caught:
        async with running_agent(tmp_path, case.config.read_text(), node=case.node_file):
            pytest.fail("the agent started")
    assert (caught.value.source, caught.value.key) == (CONFIG_SOURCE, case.key)
    assert case.expected in caught.value.expected
    assert "\n" not in str(caught.value)
