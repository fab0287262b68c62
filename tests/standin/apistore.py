"""The objects of the API-server stand-in: Nodes and Events, with the API server's own
answers (Status objects, 404/409/410/415/422), its patch semantics for them, and the
history of changes that watches read from a resourceVersion on."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"

Obj = dict[str, Any]


class StatusError(Exception):
    """An answer other than success, as the API server words it (a v1 Status)."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        self.code, self.reason = code, reason
        super().__init__(message)

    def status(self) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": str(self),
            "reason": self.reason,
            "code": self.code,
        }


def merge_patch(target: object, patch: object) -> object:
    """RFC 7386 JSON merge patch: objects merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_status_patch(status: Obj, patch: Obj) -> Obj:
    """A strategic-merge patch of a NodeStatus: `conditions` merge by their `type` (the
    patch strategy Kubernetes declares for them); every other field merges as JSON."""
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    for change in patch.get("conditions", []) or []:
        if not isinstance(change, dict) or "type" not in change:
            raise StatusError(422, "Invalid", "status.conditions: each needs a type")
        if change.get("$patch") == "delete":
            conditions.pop(change["type"], None)
        else:
            conditions[change["type"]] = merge_patch(conditions.get(change["type"]), change)
    rest = {k: v for k, v in patch.items() if k != "conditions"}
    merged = merge_patch(status, rest)
    assert isinstance(merged, dict)
    merged["conditions"] = list(conditions.values())
    return merged


def _condition(status: Obj, kind: str) -> Obj | None:
    for c in status.get("conditions", []):
        if c.get("type") == kind:
            return dict(c)
    return None


@dataclass(frozen=True)
class Change:
    """One line of a watch: what happened to an object, at which resourceVersion."""

    version: int
    type: str  # ADDED, MODIFIED or DELETED
    kind: str
    namespace: str | None  # None for a cluster-scoped object (a Node)
    obj: Obj  # as it was then

    def matches(self, kind: str, namespace: str | None) -> bool:
        return self.kind == kind and namespace in (None, self.namespace)


@dataclass
class Store:
    nodes: dict[str, Obj] = field(default_factory=dict)
    events: dict[tuple[str, str], Obj] = field(default_factory=dict)
    statuses: list[tuple[str, Obj]] = field(default_factory=list)  # (node, status) patched
    history: list[Change] = field(default_factory=list)
    version: int = 0  # the newest resourceVersion given out
    compacted: int = 0  # a watch from before this version is answered 410 Gone
    listeners: list[Callable[[], None]] = field(default_factory=list)  # told of each change

    def add_node(self, name: str) -> Obj:
        node = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": self._rv()},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
            },
        }
        self.nodes[name] = node
        self._changed("ADDED", "Node", None, node)
        return node

    def delete_node(self, name: str) -> Obj:
        node = self.nodes.pop(name, None)
        if node is None:
            raise StatusError(404, "NotFound", f'nodes "{name}" not found')
        self._changed("DELETED", "Node", None, node, self._rv())
        return node

    def node(self, name: str) -> Obj:
        try:
            return self.nodes[name]
        except KeyError:
            raise StatusError(404, "NotFound", f'nodes "{name}" not found') from None

    def patch_node_status(self, name: str, patch: Obj, content_type: str) -> Obj:
        node = self.node(name)
        extra = set(patch) - {"status", "metadata"}
        if extra:  # the status subresource changes only the status
            patch = {k: v for k, v in patch.items() if k not in extra}
        status = patch.get("status", {})
        if content_type == STRATEGIC:
            node["status"] = strategic_status_patch(node["status"], status)
        elif content_type == MERGE:
            node["status"] = merge_patch(node["status"], status)
        else:
            raise StatusError(415, "UnsupportedMediaType", f"the body of type {content_type!r}")
        node["metadata"]["resourceVersion"] = self._rv()
        self.statuses.append((name, copy.deepcopy(node["status"])))
        self._changed("MODIFIED", "Node", None, node)
        return node

    def condition(self, node: str, kind: str) -> Obj | None:
        return _condition(self.node(node)["status"], kind)

    def condition_history(self, node: str, kind: str) -> list[str]:
        """The condition's status after each patch of the node's status that had it."""
        seen = [_condition(status, kind) for name, status in self.statuses if name == node]
        return [str(c["status"]) for c in seen if c is not None]

    def create_event(self, namespace: str, event: Obj) -> Obj:
        meta = event.get("metadata") or {}
        name = meta.get("name")
        if not name or not isinstance(event.get("involvedObject"), dict):
            raise StatusError(422, "Invalid", "metadata.name and involvedObject are required")
        if meta.get("namespace", namespace) != namespace:
            raise StatusError(400, "BadRequest", "the namespace of the object does not match")
        involved = event["involvedObject"]
        if not involved.get("namespace") and namespace != "default":
            # The API server's rule for Events of cluster-scoped objects (a Node).
            raise StatusError(
                422, "Invalid", "involvedObject.namespace: does not match event.namespace"
            )
        if (namespace, name) in self.events:
            raise StatusError(409, "AlreadyExists", f'events "{name}" already exists')
        stored = copy.deepcopy(event)
        stored["metadata"] = {**meta, "namespace": namespace, "resourceVersion": self._rv()}
        self.events[namespace, name] = stored
        self._changed("ADDED", "Event", namespace, stored)
        return stored

    def patch_event(self, namespace: str, name: str, patch: Obj, content_type: str) -> Obj:
        if content_type not in (STRATEGIC, MERGE):
            raise StatusError(415, "UnsupportedMediaType", f"the body of type {content_type!r}")
        event = self.events.get((namespace, name))
        if event is None:
            raise StatusError(404, "NotFound", f'events "{name}" not found')
        merged = merge_patch(event, patch)  # an Event's patched fields hold no lists
        assert isinstance(merged, dict)
        merged["metadata"]["resourceVersion"] = self._rv()
        self.events[namespace, name] = merged
        self._changed("MODIFIED", "Event", namespace, merged)
        return merged

    def delete_event(self, namespace: str, name: str) -> Obj:
        event = self.events.pop((namespace, name), None)
        if event is None:
            raise StatusError(404, "NotFound", f'events "{name}" not found')
        self._changed("DELETED", "Event", namespace, event, self._rv())
        return event

    def event_list(self, namespace: str | None) -> Obj:
        items = [e for (ns, _), e in self.events.items() if namespace in (None, ns)]
        return self._list("EventList", items)

    def node_list(self) -> Obj:
        return self._list("NodeList", list(self.nodes.values()))

    def objects(self, kind: str, namespace: str | None) -> list[Obj]:
        """What a watch from no resourceVersion starts with, as ADDED."""
        listed = self.node_list() if kind == "Node" else self.event_list(namespace)
        return list(listed["items"])

    def changes_since(self, version: int, kind: str, namespace: str | None) -> list[Change]:
        """The changes after `version`; 410 Gone if some of them were compacted away."""
        if version < self.compacted:
            raise StatusError(
                410, "Expired", f"too old resource version: {version} ({self.compacted})"
            )
        return [c for c in self.history if c.version > version and c.matches(kind, namespace)]

    def compact(self) -> None:
        """Forget the history, as the API server's etcd compaction does."""
        self.history.clear()
        self.compacted = self.version

    def _list(self, kind: str, items: list[Obj]) -> Obj:
        return {
            "kind": kind,
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self.version)},
            "items": copy.deepcopy(items),
        }

    def _changed(
        self, type_: str, kind: str, namespace: str | None, obj: Obj, version: str | None = None
    ) -> None:
        seen = copy.deepcopy(obj)
        if version is not None:  # a deletion has a version of its own
            seen["metadata"]["resourceVersion"] = version
        rv = int(seen["metadata"]["resourceVersion"])
        self.history.append(Change(rv, type_, kind, namespace, seen))
        for listener in self.listeners:
            listener()

    def _rv(self) -> str:
        self.version += 1
        return str(self.version)
