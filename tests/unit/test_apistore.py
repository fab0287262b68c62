"""The API-server stand-in answers as the API server does: strategic-merge patches of a
Node's conditions merge by type, JSON merge patches replace the list, and the errors."""

from __future__ import annotations

import pytest

from tests.standin.apistore import MERGE, STRATEGIC, StatusError, Store

OURS = {"type": "DevicesHealthy", "status": "False", "reason": "DeviceUnhealthy"}


def test_strategic_patch_merges_conditions_by_type() -> None:
    store = Store()
    store.add_node("n")
    store.patch_node_status("n", {"status": {"conditions": [OURS]}}, STRATEGIC)
    patch = {"status": {"conditions": [{"type": "DevicesHealthy", "status": "True"}]}}
    store.patch_node_status("n", patch, STRATEGIC)
    kinds = {c["type"]: c for c in store.node("n")["status"]["conditions"]}
    assert set(kinds) == {"Ready", "DevicesHealthy"}
    assert kinds["DevicesHealthy"] == {**OURS, "status": "True"}


def test_json_merge_patch_replaces_the_conditions_list() -> None:
    store = Store()
    store.add_node("n")
    store.patch_node_status("n", {"status": {"conditions": [OURS]}}, MERGE)
    assert [c["type"] for c in store.node("n")["status"]["conditions"]] == ["DevicesHealthy"]


def test_other_patch_types_are_unsupported_media() -> None:
    store = Store()
    store.add_node("n")
    with pytest.raises(StatusError) as err:
        store.patch_node_status("n", {"status": {}}, "application/json-patch+json")
    assert err.value.code == 415


def test_unknown_node_is_not_found() -> None:
    with pytest.raises(StatusError) as err:
        Store().patch_node_status("absent", {}, STRATEGIC)
    assert (err.value.code, err.value.status()["reason"]) == (404, "NotFound")


def test_events_conflict_on_a_name_and_a_node_event_belongs_in_default() -> None:
    store = Store()
    event = {"metadata": {"name": "e"}, "involvedObject": {"kind": "Node", "name": "n"}}
    store.create_event("default", event)
    with pytest.raises(StatusError) as err:
        store.create_event("default", event)
    assert err.value.code == 409
    with pytest.raises(StatusError) as err:
        store.create_event("kube-system", event)
    assert err.value.code == 422


def test_event_patch_merges_and_a_missing_event_is_not_found() -> None:
    store = Store()
    store.create_event("default", {"metadata": {"name": "e"}, "involvedObject": {}, "count": 1})
    assert store.patch_event("default", "e", {"count": 2}, STRATEGIC)["count"] == 2
    with pytest.raises(StatusError) as err:
        store.patch_event("default", "gone", {"count": 2}, STRATEGIC)
    assert err.value.code == 404


def test_changes_carry_their_versions_and_a_deletion_has_its_own() -> None:
    store = Store()
    store.add_node("n")
    since = store.version
    store.create_event("default", {"metadata": {"name": "e"}, "involvedObject": {}, "count": 1})
    store.patch_event("default", "e", {"count": 2}, STRATEGIC)
    store.delete_event("default", "e")
    changes = store.changes_since(since, "Event", "default")
    assert [c.type for c in changes] == ["ADDED", "MODIFIED", "DELETED"]
    assert (
        [c.version for c in changes]
        == [since + 1, since + 2, since + 3]
        == [int(c.obj["metadata"]["resourceVersion"]) for c in changes]
    )
    assert store.changes_since(since, "Event", "kube-system") == []
    assert store.changes_since(since, "Node", None) == []


def test_a_version_from_before_a_compaction_is_gone() -> None:
    store = Store()
    store.add_node("n")
    old = store.version
    store.patch_node_status("n", {"status": {}}, STRATEGIC)
    store.compact()
    with pytest.raises(StatusError) as err:
        store.changes_since(old, "Node", None)
    assert (err.value.code, err.value.reason) == (410, "Expired")
    assert store.changes_since(store.version, "Node", None) == []


def _slice(devices: list[dict[str, object]], **meta: object) -> dict[str, object]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta or {"name": "n-gpu-0"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "n",
            "pool": {"name": "n", "generation": 0, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def test_slice_generate_name_conflict_and_generation() -> None:
    store = Store()
    made = store.create_slice(_slice([{"name": "gpu-0"}], generateName="n-gpu-"))
    name = made["metadata"]["name"]
    assert name.startswith("n-gpu-") and len(name) == len("n-gpu-") + 5
    assert made["metadata"]["generation"] == 1
    stale = dict(made, metadata=dict(made["metadata"]))
    changed = store.update_slice(name, dict(made, spec={**made["spec"], "devices": []}))
    assert changed["metadata"]["generation"] == 2
    with pytest.raises(StatusError) as err:
        store.update_slice(name, stale)  # its resourceVersion is the old one
    assert (err.value.code, err.value.reason) == (409, "Conflict")


@pytest.mark.parametrize(
    ("device", "field"),
    [
        ({"name": "GPU_0"}, "spec.devices[0].name"),
        (
            {"name": "d", "attributes": {"a": {"int": 1, "string": "x"}}},
            "spec.devices[0].attributes[a]",
        ),
        (
            {"name": "d", "attributes": {"a": {"string": "x" * 65}}},
            "spec.devices[0].attributes[a].string",
        ),
        (
            {"name": "d", "attributes": {"a": {"version": "12.4"}}},
            "spec.devices[0].attributes[a].version",
        ),
        ({"name": "d", "attributes": {f"a{i}": {"int": i} for i in range(33)}}, "spec.devices[0]"),
        (
            {"name": "d", "taints": [{"key": f"k{i}", "effect": "NoSchedule"} for i in range(5)]},
            "spec.devices[0].taints",
        ),
        (
            {"name": "d", "taints": [{"key": "k", "effect": "Sometimes"}]},
            "spec.devices[0].taints[0].effect",
        ),
    ],
    ids=["name", "two-values", "long-string", "not-semver", "33-attributes", "5-taints", "effect"],
)
def test_invalid_slices_are_refused_with_the_field(device: dict[str, object], field: str) -> None:
    with pytest.raises(StatusError) as err:
        Store().create_slice(_slice([device]))
    assert err.value.code == 422
    assert field in [c["field"] for c in err.value.status()["details"]["causes"]]


def test_129_devices_are_too_many_for_one_slice() -> None:
    with pytest.raises(StatusError) as err:
        Store().create_slice(_slice([{"name": f"d{i}"} for i in range(129)]))
    assert err.value.code == 422


def test_without_the_taints_gate_taints_are_dropped_silently() -> None:
    store = Store(device_taints=False)
    taint = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    made = store.create_slice(_slice([{"name": "d", "taints": [taint]}]))
    assert "taints" not in made["spec"]["devices"][0]
