"""The objects of the API-server stand-in: Nodes and Events, with the API server's own
answers (Status objects, 404/409/415/422) and its patch semantics for them."""

from __future__ import annotations

import copy
import itertools
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


@dataclass
class Store:
    nodes: dict[str, Obj] = field(default_factory=dict)
    events: dict[tuple[str, str], Obj] = field(default_factory=dict)
    statuses: list[tuple[str, Obj]] = field(default_factory=list)  # (node, status) patched
    _versions: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

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
        return merged

    def event_list(self, namespace: str | None) -> Obj:
        items = [e for (ns, _), e in self.events.items() if namespace in (None, ns)]
        return {"kind": "EventList", "apiVersion": "v1", "items": copy.deepcopy(items)}

    def _rv(self) -> str:
        return str(next(self._versions))
