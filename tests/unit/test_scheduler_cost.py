"""The pure parts of hack/scheduler_cost: the slice templates it copies (as the agent
published them), each node's copy, the claims and pods it measures, the fill and the
figures' arithmetic. The tool itself needs a cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hack.schedcostlib.objects import (
    LABEL,
    SHARE,
    SLICES,
    TemplateError,
    check_room,
    claim,
    fill_count,
    load_template,
    node_name,
    node_object,
    node_slice,
    percentile,
    pod,
    shared,
    summary,
    table,
)


def tiny_slice(**spec: Any) -> str:
    device = {"name": "gpu-0", "capacity": {"memory": {"value": "81559Mi"}}}
    body = {"driver": "gpu.nvidia.com", "nodeName": "vm", "devices": [device]} | spec
    return json.dumps({"kind": "ResourceSlice", "metadata": {"name": "vm-gpu"}, "spec": body})


def test_the_kept_templates_are_the_agents_slices_with_and_without_shares() -> None:
    plain = load_template((SLICES / "h100x8-plain.json").read_text(), "plain")
    shares = load_template((SLICES / "h100x8-shares.json").read_text(), "shares")
    assert (len(plain["devices"]), len(shares["devices"])) == (8, 8)
    assert not shared(plain)
    assert shared(shares)
    memory = shares["devices"][0]["capacity"]["memory"]
    assert memory["requestPolicy"]["validRange"] == {"min": "1Gi", "max": "79Gi", "step": "1Gi"}
    assert [d["name"] for d in plain["devices"]] == [d["name"] for d in shares["devices"]]


def test_each_node_gets_its_own_copy_named_as_the_agent_names_it() -> None:
    template = load_template(tiny_slice(), "tiny")
    a, b = (node_slice(template, node_name(i)) for i in (0, 1))
    assert a["metadata"]["name"] == "cost-0000-gpu-nvidia-com-0"
    assert a["spec"]["nodeName"] == a["spec"]["pool"]["name"] == "cost-0000"
    assert b["spec"]["pool"] == {"name": "cost-0001", "generation": 1, "resourceSliceCount": 1}
    assert a["metadata"]["labels"] == {LABEL: "true"}
    a["spec"]["devices"][0]["name"] = "changed"
    assert b["spec"]["devices"][0]["name"] == template["devices"][0]["name"] == "gpu-0"
    assert "ownerReferences" not in a["metadata"]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{", "not JSON"),
        (json.dumps({"kind": "Pod", "spec": {}}), "not a ResourceSlice"),
        (tiny_slice(driver="roce.node-agents.io"), "driver"),
        (tiny_slice(devices=[]), "no devices"),
        (tiny_slice(sharedCounters=[{"name": "c"}]), "sharedCounters"),
    ],
)
def test_a_template_it_cannot_copy_is_refused(text: str, why: str) -> None:
    with pytest.raises(TemplateError, match=why):
        load_template(text, "bad")


def test_the_claims_measured_and_their_pods() -> None:
    share = claim("s", "share")["spec"]["devices"]["requests"][0]["exactly"]
    assert (
        share["capacity"]
        == {"requests": SHARE}
        == {"requests": {"memory": "20Gi", "compute": "25"}}
    )
    whole = claim("w", "whole", 8)["spec"]["devices"]["requests"][0]["exactly"]
    assert "capacity" not in whole
    assert (whole["count"], whole["deviceClassName"]) == (8, "gpu.nvidia.com")
    with pytest.raises(ValueError, match="claim kind"):
        claim("x", "half")
    spec = pod("p", "s", "sample")["spec"]
    assert spec["resourceClaims"] == [{"name": "gpu", "resourceClaimName": "s"}]
    assert spec["nodeSelector"] == {LABEL: "true"}
    assert spec["tolerations"] == [{"operator": "Exists"}]  # unreachable kubelet-less nodes


def test_nodes_are_made_unreachable_and_for_this_tool_only() -> None:
    node = node_object("cost-0007")
    assert node["spec"]["taints"] == [
        {"key": LABEL, "value": "true", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
    ]
    assert node["metadata"]["labels"][LABEL] == "true"
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions == dict.fromkeys(
        ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure"), "Unknown"
    )


def test_fill_and_figures() -> None:
    assert fill_count(1000, 0.99) == 990
    shares = load_template((SLICES / "h100x8-shares.json").read_text(), "shares")
    check_room(1000, 0.99, shares, 39)  # 80 GPUs free: 2 x (39 + 1 warm-up)
    with pytest.raises(ValueError, match="80 GPUs left free"):
        check_room(1000, 0.99, shares, 40)
    assert fill_count(10, 0.0) == 0
    with pytest.raises(ValueError, match="fraction"):
        fill_count(10, 1.0)
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99)) == (50.0, 99.0)
    assert percentile([7.0], 99) == 7.0
    got = summary([3.0, 1.0, 2.0])
    assert got == {"samples": 3, "p50_ms": 2.0, "p99_ms": 3.0, "max_ms": 3.0}
    row = {"slices": "shares", "full_pct": 99.0, "claim": "share"} | got
    assert "| with sharing.shares | 99.0 % | share | 3 | 2.0 ms | 3.0 ms | 3.0 ms |" in table([row])
