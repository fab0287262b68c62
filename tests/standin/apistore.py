"""The objects of the API-server stand-in: Nodes, Events, ResourceSlices and
ResourceClaims, with the API server's own answers (Status objects, 404/409/410/415/422),
its patch and update semantics for them, and the history of changes that watches read
from a resourceVersion on."""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.standin.slicecheck import API_VERSION, invalid_message, slice_errors

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

Obj = dict[str, Any]


class StatusError(Exception):
    """An answer other than success, as the API server words it (a v1 Status)."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        self.code, self.reason, self.details = code, reason, details
        super().__init__(message)

    def status(self) -> Obj:
        extra = {"details": self.details} if self.details else {}
        return extra | {
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

    def matches(self, kind: str, namespace: str | None, match: Match) -> bool:
        return self.kind == kind and namespace in (None, self.namespace) and match(self.obj)


Match = Callable[[Obj], bool]  # a field and label selector's choice


def everything(_: Obj) -> bool:
    return True


SLICES = "resourceslices.resource.k8s.io"
CLAIMS = "resourceclaims.resource.k8s.io"
NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what generateName appends five of


@dataclass
class Store:
    nodes: dict[str, Obj] = field(default_factory=dict)
    events: dict[tuple[str, str], Obj] = field(default_factory=dict)
    statuses: list[tuple[str, Obj]] = field(default_factory=list)  # (node, status) patched
    label_patches: list[tuple[str, Obj]] = field(default_factory=list)  # (node, labels patch)
    history: list[Change] = field(default_factory=list)
    version: int = 0  # the newest resourceVersion given out
    compacted: int = 0  # a watch from before this version is answered 410 Gone
    listeners: list[Callable[[], None]] = field(default_factory=list)  # told of each change
    slices: dict[str, Obj] = field(default_factory=dict)
    claims: dict[tuple[str, str], Obj] = field(default_factory=dict)
    # False: as an API server without the DRADeviceTaints gate (alpha in v1.34), which
    # drops devices' taints from what it stores without a word.
    device_taints: bool = True
    # False: as an API server without DRAConsumableCapacity (off by default before
    # v1.36), which drops devices' multiple allocations and capacities' request policies.
    consumable_capacity: bool = True
    _uids: itertools.count[int] = field(default_factory=itertools.count)

    def add_node(self, name: str, labels: dict[str, str] | None = None) -> Obj:
        meta: Obj = {"name": name, "uid": f"uid-{name}", "resourceVersion": self._rv()}
        if labels:
            meta["labels"] = dict(labels)
        node = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": meta,
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

    def label_node(self, name: str, key: str, value: str | None) -> Obj:
        """Set label `key` on a Node (None: remove it), as `kubectl label node` does."""
        node = self.node(name)
        labels = node["metadata"].setdefault("labels", {})
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
        node["metadata"]["resourceVersion"] = self._rv()
        self._changed("MODIFIED", "Node", None, node)
        return node

    def node(self, name: str) -> Obj:
        try:
            return self.nodes[name]
        except KeyError:
            raise StatusError(404, "NotFound", f'nodes "{name}" not found') from None

    def patch_node_status(self, name: str, patch: Any, content_type: str) -> Obj:
        node = self.node(name)
        if content_type == JSON_PATCH:
            patched = json_patch(node, patch)
            node["status"] = patched["status"]  # the status subresource: nothing else
            node["metadata"]["resourceVersion"] = self._rv()
            self.statuses.append((name, copy.deepcopy(node["status"])))
            self._changed("MODIFIED", "Node", None, node)
            return node
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

    def patch_node(self, name: str, patch: object, content_type: str) -> Obj:
        """A merge (or strategic-merge) patch of a Node's labels; anything else is refused."""
        node = self.node(name)
        if content_type not in (STRATEGIC, MERGE):
            raise StatusError(415, "UnsupportedMediaType", f"the body of type {content_type!r}")
        meta = patch.get("metadata") if isinstance(patch, dict) else None
        if not isinstance(patch, dict) or set(patch) != {"metadata"} or not isinstance(meta, dict):
            raise StatusError(422, "Invalid", "this stand-in patches only metadata.labels")
        if set(meta) != {"labels"}:
            raise StatusError(422, "Invalid", "this stand-in patches only metadata.labels")
        labels = merge_patch(node["metadata"].get("labels", {}), meta["labels"])
        node["metadata"]["labels"] = labels
        node["metadata"]["resourceVersion"] = self._rv()
        self.label_patches.append((name, copy.deepcopy(meta["labels"])))
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

    def create_slice(self, obj: Obj) -> Obj:
        """POST a ResourceSlice: a name from `generateName` if it has none, then checked,
        then stored with the server's own fields."""
        stored = self._slice_body(obj)
        meta = stored["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(NAME_CHARS, k=5))
        if errors := slice_errors(stored):
            raise StatusError(422, "Invalid", *invalid_message(meta.get("name") or "", errors))
        name = meta["name"]
        if name in self.slices:
            raise StatusError(409, "AlreadyExists", f'{SLICES} "{name}" already exists')
        meta.update(
            uid=f"uid-slice-{next(self._uids)}",
            generation=1,
            creationTimestamp="2025-01-01T00:00:00Z",
            resourceVersion=self._rv(),
        )
        self.slices[name] = stored
        self._changed("ADDED", "ResourceSlice", None, stored)
        return stored

    def update_slice(self, name: str, obj: Obj) -> Obj:
        """PUT a ResourceSlice: 409 Conflict if its resourceVersion is not the stored one
        (none given: unconditional), generation + 1 when the spec changed."""
        old = self.slice(name)
        stored = self._slice_body(obj)
        meta = stored["metadata"]
        if meta.get("name") != name:
            raise StatusError(400, "BadRequest", "the name of the object does not match")
        version = meta.get("resourceVersion")
        if version and version != old["metadata"]["resourceVersion"]:
            raise StatusError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {SLICES} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
            )
        if errors := slice_errors(stored, old):
            raise StatusError(422, "Invalid", *invalid_message(name, errors))
        generation = old["metadata"]["generation"] + (stored["spec"] != old["spec"])
        kept = {k: old["metadata"][k] for k in ("uid", "creationTimestamp")}
        meta.update(kept, generation=generation, resourceVersion=self._rv())
        self.slices[name] = stored
        self._changed("MODIFIED", "ResourceSlice", None, stored)
        return stored

    def slice(self, name: str) -> Obj:
        try:
            return self.slices[name]
        except KeyError:
            raise StatusError(404, "NotFound", f'{SLICES} "{name}" not found') from None

    def delete_slice(self, name: str) -> Obj:
        found = self.slice(name)
        del self.slices[name]
        self._changed("DELETED", "ResourceSlice", None, found, self._rv())
        return found

    def delete_node_slices(self, node: str) -> list[str]:
        """Delete the slices of `node`, as the kubelet does when it starts."""
        names = [n for n, s in self.slices.items() if s["spec"].get("nodeName") == node]
        for name in names:
            self.delete_slice(name)
        return names

    def slice_list(self, match: Match = everything) -> Obj:
        items = [s for s in self.slices.values() if match(s)]
        return self._list("ResourceSliceList", items, API_VERSION)

    def put_claim(
        self,
        namespace: str,
        name: str,
        uid: str,
        results: Iterable[Obj] | None,
        config: Iterable[Obj] = (),
    ) -> Obj:
        """Store a ResourceClaim as the scheduler leaves it: allocated to `results`
        ({request, driver, pool, device, adminAccess?}) with `config`, or, for None,
        not allocated."""
        status: Obj = {}
        if results is not None:
            devices = {"results": list(results), "config": list(config)}
            status = {"allocation": {"devices": devices}}
        claim = {
            "apiVersion": API_VERSION,
            "kind": "ResourceClaim",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid,
                "resourceVersion": self._rv(),
            },
            "spec": {"devices": {"requests": []}},
            "status": status,
        }
        self.claims[namespace, name] = claim
        self._changed("ADDED", "ResourceClaim", namespace, claim)
        return claim

    def claim(self, namespace: str, name: str) -> Obj:
        try:
            return self.claims[namespace, name]
        except KeyError:
            raise StatusError(404, "NotFound", f'{CLAIMS} "{name}" not found') from None

    def _slice_body(self, obj: Obj) -> Obj:
        if obj.get("apiVersion") != API_VERSION or obj.get("kind") != "ResourceSlice":
            raise StatusError(
                400,
                "BadRequest",
                f"the API version in the data ({obj.get('apiVersion')}) does not match "
                f"the expected API version ({API_VERSION})",
            )
        stored = copy.deepcopy(obj)
        stored.setdefault("metadata", {})
        stored.setdefault("spec", {})
        for device in stored["spec"].get("devices") or []:
            if not self.device_taints:
                device.pop("taints", None)
            if not self.consumable_capacity:
                device.pop("allowMultipleAllocations", None)
                for capacity in (device.get("capacity") or {}).values():
                    capacity.pop("requestPolicy", None)
            for taint in device.get("taints") or []:
                taint.setdefault("timeAdded", "2025-01-01T00:00:00Z")  # its default
        return stored

    def node_list(self) -> Obj:
        return self._list("NodeList", list(self.nodes.values()))

    def objects(self, kind: str, namespace: str | None, match: Match = everything) -> list[Obj]:
        """What a watch from no resourceVersion starts with, as ADDED."""
        if kind == "ResourceSlice":
            return list(self.slice_list(match)["items"])
        listed = self.node_list() if kind == "Node" else self.event_list(namespace)
        return list(listed["items"])

    def changes_since(
        self, version: int, kind: str, namespace: str | None, match: Match = everything
    ) -> list[Change]:
        """The changes after `version`; 410 Gone if some of them were compacted away."""
        if version < self.compacted:
            raise StatusError(
                410, "Expired", f"too old resource version: {version} ({self.compacted})"
            )
        return [
            c for c in self.history if c.version > version and c.matches(kind, namespace, match)
        ]

    def compact(self) -> None:
        """Forget the history, as the API server's etcd compaction does."""
        self.history.clear()
        self.compacted = self.version

    def _list(self, kind: str, items: list[Obj], api_version: str = "v1") -> Obj:
        return {
            "kind": kind,
            "apiVersion": api_version,
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


def json_patch(document: Obj, operations: object) -> Obj:
    """RFC 6902 on a copy of `document`: add, remove, replace and test, as the API server
    applies them (a failed test or a missing path: 422, nothing changed)."""
    if not isinstance(operations, list):
        raise StatusError(400, "BadRequest", "a JSON patch is a list of operations")
    out = copy.deepcopy(document)
    for op in operations:
        keys = [k.replace("~1", "/").replace("~0", "~") for k in str(op["path"]).split("/")[1:]]
        parent: Any = out
        for key in keys[:-1]:
            if not isinstance(parent, dict) or key not in parent:
                raise StatusError(422, "Invalid", f"the path {op['path']!r} does not exist")
            parent = parent[key]
        last = keys[-1]
        kind = op["op"]
        if kind in ("remove", "replace", "test") and last not in parent:
            raise StatusError(422, "Invalid", f"the path {op['path']!r} does not exist")
        if kind == "test" and parent[last] != op["value"]:
            raise StatusError(422, "Invalid", f"test of {op['path']!r} failed")
        if kind == "remove":
            del parent[last]
        elif kind in ("add", "replace"):
            parent[last] = op["value"]
        elif kind != "test":
            raise StatusError(422, "Invalid", f"unsupported operation {kind!r}")
    return out
