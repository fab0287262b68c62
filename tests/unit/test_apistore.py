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
