"""One DRA driver's prepare and unprepare: a claim's results checked against the devices
the driver publishes, their container edits written as a CDI spec, the claim recorded in
the driver's checkpoint. The gRPC servers (agents/dra/server.py) call this."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from agents.dra.cdi import CdiDevice, CdiSpecs, cdi_ids
from agents.dra.claim_checkpoint import (
    CHECKPOINT,
    CheckpointError,
    ClaimCheckpoint,
    PreparedClaim,
    PreparedDevice,
    share_name,
)
from agents.dra.claims import AllocationResult, Claim, ClaimError, consumed
from agents.dra.share_holds import ShareHolds
from agents.kernel.catalogue import Resource
from agents.kernel.edits import Consumed, ContainerEdits, DeviceKey
from agents.kernel.facts import DeviceFacts, FamilyFacts, takes_none
from agents.tasks import off_loop

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} ({self.uid})"


class Store(Protocol):
    """Where a driver keeps its prepared claims (by claim UID): the checkpoint and the CDI
    specs. Blocking; called off the event loop."""

    def load(self) -> dict[str, PreparedClaim]: ...

    def save(self, claims: Mapping[str, PreparedClaim]) -> None: ...

    def write_spec(self, uid: str, claim: PreparedClaim) -> None: ...

    def remove_spec(self, uid: str) -> None: ...

    def specs(self) -> list[str]:
        """Claim UIDs of the CDI specs present."""
        ...


ReadClaim = Callable[[ClaimRef], Awaitable[Claim]]  # raises ClaimError


class Edits(Protocol):
    """What a family says a container gets for a claim's devices (and its shares)."""

    def __call__(
        self, devices: Sequence[DeviceKey], consumed: Consumed | None = None, /
    ) -> ContainerEdits: ...


class ClaimStore:
    """A driver's checkpoint in `<plugins-dir>/<driver>/` and its specs in the CDI root."""

    def __init__(self, driver: str, plugins_dir: Path, cdi_root: Path) -> None:
        self.driver = driver
        self.checkpoint = ClaimCheckpoint(plugins_dir / driver / CHECKPOINT)
        self.cdi = CdiSpecs(cdi_root)

    def load(self) -> dict[str, PreparedClaim]:
        try:
            return self.checkpoint.load()
        except CheckpointError as exc:
            log.error(
                "dra_checkpoint_unusable",
                driver=self.driver,
                error=str(exc),
                effect="starting with no prepared claims",
            )
            return {}

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        self.checkpoint.save(claims)

    def write_spec(self, uid: str, claim: PreparedClaim) -> None:
        self.cdi.write(self.driver, uid, _cdi_devices(claim), claim.env, claim.mounts)

    def remove_spec(self, uid: str) -> None:
        self.cdi.remove(self.driver, uid)

    def specs(self) -> list[str]:
        return [uid for _, uid in self.cdi.written(self.driver)]


def _cdi_devices(claim: PreparedClaim) -> list[CdiDevice]:
    return [CdiDevice(d.cdi_name, d.nodes) for d in claim.devices]


class Driver:
    """One driver's published devices and prepared claims. Used from the event loop."""

    def __init__(
        self,
        name: str,
        pool: str,
        store: Store,
        read_claim: ReadClaim,
        *,
        withheld: Callable[[str, str], bool] = lambda _resource, _id: False,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self.pool = pool
        self._store = store
        self._read_claim = read_claim
        self._withheld = withheld  # (resource, device ID) held through the device-plugin API
        self._on_change = on_change  # told after each change of `prepared`
        self._devices: dict[str, DeviceFacts] = {}
        self._resources: dict[str, Resource] = {}
        self._edits: Edits = lambda _devices, _consumed=None: ContainerEdits()
        self._accepts: Callable[[Mapping[str, object]], str | None] = takes_none
        self._holds = ShareHolds(name)  # what its family is told of the shares prepared
        self.prepared: dict[str, PreparedClaim] = {}
        self._lock = asyncio.Lock()

    def publish(
        self,
        devices: FamilyFacts,
        resources: Mapping[str, Resource],
        edits: Edits,
    ) -> None:
        """The devices the driver serves now (at start, on reload, on a device change),
        and what a container gets for a set of them (their family's answer)."""
        self._devices = {d.name: d for d in devices.devices}
        self._resources = dict(resources)
        self._edits = edits
        self._accepts = devices.accepts
        self._holds.family = devices.shares_held

    def device(self, name: str) -> DeviceFacts | None:
        return self._devices.get(name)

    def healthy(self, device: DeviceFacts) -> bool:
        resource = self._resources.get(device.resource)
        found = resource.inventory.get(device.device_id) if resource is not None else None
        # Degraded works: a device the kubelet is told is Unhealthy only for being Degraded
        # (health.degraded.report) is prepared like any other.
        return found is not None and (found.healthy or found.degraded)

    def holder(self, device: str, *, share: bool) -> ClaimRef | None:
        """A claim that holds `device` so that it cannot be prepared again: whole (for
        a share, or for all of it), or a share of it (for all of it)."""
        for uid, claim in self.prepared.items():
            for d in claim.devices:
                if d.device == device and not d.admin_access and not (share and d.share_id):
                    return ClaimRef(claim.namespace, uid, claim.name)
        return None

    async def restore(self) -> None:
        """Take up the claims of the checkpoint and write their CDI specs again (the CDI
        root is a tmpfs that a reboot empties)."""
        self.prepared = await off_loop(self._store.load, f"{self.name}-checkpoint")
        for uid, claim in self.prepared.items():
            write = functools.partial(self._store.write_spec, uid, claim)
            await off_loop(write, f"{self.name}-cdi")
        for uid in await off_loop(self._store.specs, f"{self.name}-cdi"):
            if uid not in self.prepared:  # written, but never checkpointed: not prepared
                await off_loop(functools.partial(self._store.remove_spec, uid), f"{self.name}-cdi")
        if self.prepared:
            log.info("dra_claims_restored", driver=self.name, claims=len(self.prepared))

    async def settle_shares(self) -> None:
        """Tell the family which devices hold shares (at start, after a reload)."""
        async with self._lock:
            await self._holds.settle(self.prepared)

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PreparedClaim | ClaimError]:
        """Each claim prepared, or its own error; one claim's failure touches no other."""
        reads = await asyncio.gather(*(self._read(c) for c in claims))
        out: dict[str, PreparedClaim | ClaimError] = {}
        for claim, read in zip(claims, reads, strict=True):
            if isinstance(read, ClaimError):
                out[claim.uid] = read
                continue
            try:
                out[claim.uid] = await self._prepare(claim, read)
            except ClaimError as exc:
                out[claim.uid] = exc
            except Exception as exc:  # a bug, or the disk: this claim fails, not the call
                log.exception("dra_prepare_failed", driver=self.name, claim=str(claim))
                out[claim.uid] = ClaimError(f"prepare failed: {exc}")
            if isinstance(out[claim.uid], ClaimError):
                log.warning(
                    "dra_prepare_refused",
                    driver=self.name,
                    claim=str(claim),
                    error=str(out[claim.uid]),
                )
        return out

    async def _read(self, claim: ClaimRef) -> Claim | ClaimError:
        if claim.uid in self.prepared:  # answered from the checkpoint: no API request
            return Claim(claim.namespace, claim.name, claim.uid, (), ())
        try:
            return await self._read_claim(claim)
        except ClaimError as exc:
            return exc

    async def _prepare(self, claim: ClaimRef, allocated: Claim) -> PreparedClaim:
        async with self._lock:
            if (done := self.prepared.get(claim.uid)) is not None:
                return done  # idempotent: the kubelet retries and restarts
            mine = [r for r in allocated.results if r.driver == self.name]
            self._check_configs(allocated, mine)
            devices = [self._checked(claim, r) for r in mine]
            prepared = self._prepared(claim, mine, devices)
            claims = {**self.prepared, claim.uid: prepared}
            await self._holds.hold(claims, prepared)  # before it is recorded
            try:
                await off_loop(lambda: self._store.save(claims), f"{self.name}-checkpoint")
                write = functools.partial(self._store.write_spec, claim.uid, prepared)
                await off_loop(write, f"{self.name}-cdi")
            except BaseException:
                await self._holds.settle(self.prepared)  # its shares' holds undone
                await off_loop(lambda: self._store.save(self.prepared), f"{self.name}-checkpoint")
                raise
            self.prepared = claims
        self._on_change()
        log.info(
            "dra_claim_prepared",
            driver=self.name,
            claim=str(claim),
            devices=[d.device for d in prepared.devices],
            shares={d.cdi_name: dict(d.consumed) for d in prepared.devices if d.share_id},
        )
        return prepared

    def _check_configs(self, allocated: Claim, mine: Sequence[AllocationResult]) -> None:
        requests = {r.request for r in mine}
        for config in allocated.config:
            if config.driver != self.name:
                continue
            if config.requests and not requests.intersection(config.requests):
                continue
            parameters = config.parameters if isinstance(config.parameters, Mapping) else {}
            why = self._accepts(parameters)
            if why is not None:
                raise ClaimError(f"opaque config for {self.name}: {why}")
            log.info("dra_config_accepted", driver=self.name, parameters=parameters)

    def _checked(self, claim: ClaimRef, result: AllocationResult) -> DeviceFacts:
        if result.pool != self.pool:
            raise ClaimError(f"device {result.device}: pool {result.pool!r} is not this node's")
        device = self._devices.get(result.device)
        if device is None:
            raise ClaimError(f"device {result.device}: unknown to driver {self.name} on this node")
        if not self.healthy(device):
            raise ClaimError(f"device {result.device}: Unhealthy")
        if self._withheld(device.resource, device.device_id):
            raise ClaimError(
                f"device {result.device}: held by a running pod through the device-plugin API"
            )
        holder = self.holder(device.name, share=bool(result.share_id))
        if holder is not None and not result.admin_access:
            raise ClaimError(f"device {result.device}: already prepared for claim {holder}")
        return device

    def _prepared(
        self, claim: ClaimRef, results: Sequence[AllocationResult], devices: Sequence[DeviceFacts]
    ) -> PreparedClaim:
        """One prepared device per device held whole, and per share of a shared one."""
        by_share: dict[tuple[str, str], list[AllocationResult]] = {}
        for result in results:
            by_share.setdefault((result.device, result.share_id), []).append(result)
        facts = {d.name: d for d in devices}
        keys = {name: (d.resource, d.device_id) for name, d in facts.items()}
        shared = {keys[name]: used for name, used in consumed(results).items()}
        # once per claim; a family that shares no device is never told of shares
        edits = (
            self._edits(list(keys.values()), shared) if shared else self._edits(list(keys.values()))
        )
        env = edits.named_env()
        nodes = {name: edits.device_nodes[key] for name, key in keys.items()}
        names = [CdiDevice(share_name(n, s), nodes[n]) for n, s in by_share]
        cdi = cdi_ids(self.name, claim.uid, names, env, edits.mounts)
        prepared = tuple(
            PreparedDevice(
                device=name,
                requests=tuple(dict.fromkeys(r.request for r in held)),
                pool=self.pool,
                cdi_ids=cdi[share_name(name, share)],
                nodes=nodes[name],
                admin_access=all(r.admin_access for r in held),
                resource=facts[name].resource,
                device_id=facts[name].device_id,
                share_id=share,
                consumed=dict(held[0].consumed) if share else {},
            )
            for (name, share), held in by_share.items()
        )
        return PreparedClaim(claim.namespace, claim.name, prepared, env, edits.mounts)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimError | None]:
        out: dict[str, ClaimError | None] = {}
        for claim in claims:
            try:
                await self.forget(claim.uid)
                out[claim.uid] = None
            except OSError as exc:
                out[claim.uid] = ClaimError(f"unprepare: {exc}")
        return out

    async def forget(self, uid: str) -> None:
        """Unprepare: the claim leaves the checkpoint and its CDI spec goes. Idempotent."""
        async with self._lock:
            known = self.prepared.get(uid)
            if known is not None:
                claims = {k: v for k, v in self.prepared.items() if k != uid}
                await off_loop(lambda: self._store.save(claims), f"{self.name}-checkpoint")
                self.prepared = claims
                await self._holds.settle(claims)  # its devices perhaps held by none now
            await off_loop(lambda: self._store.remove_spec(uid), f"{self.name}-cdi")
        if known is not None:
            ref = ClaimRef(known.namespace, uid, known.name)
            log.info("dra_claim_unprepared", driver=self.name, claim=str(ref))
            self._on_change()
