"""Checks every request must pass before a family sees it; failures name the device."""

from __future__ import annotations

from collections.abc import Sequence

from agents.errors import AllocationError, Code
from agents.kernel.catalogue import Inventory


def _no_duplicates(ids: Sequence[str], what: str) -> set[str]:
    """The IDs as a set; names the first ID listed twice, if any."""
    distinct = set(ids)
    if len(distinct) == len(ids):
        return distinct
    seen: set[str] = set()
    for device_id in ids:
        if device_id in seen:
            raise AllocationError(
                Code.INVALID_ARGUMENT, f"{what}: device {device_id} is listed twice"
            )
        seen.add(device_id)
    raise AssertionError("unreachable: a shorter set means a duplicate")


def _all_known(inventory: Inventory, ids: Sequence[str], distinct: set[str], resource: str) -> None:
    """Names the first ID the inventory does not hold, if any (`distinct` is set(ids))."""
    if inventory.ids() >= distinct:
        return
    for device_id in ids:
        if inventory.get(device_id) is None:
            raise AllocationError(
                Code.INVALID_ARGUMENT, f"unknown device {device_id} for resource {resource}"
            )


def check_allocate(inventory: Inventory, ids: Sequence[str], resource: str) -> None:
    """Allocate takes known, healthy, distinct devices, at least one."""
    if not ids:
        raise AllocationError(Code.INVALID_ARGUMENT, f"allocate for {resource}: no device IDs")
    distinct = _no_duplicates(ids, f"allocate for {resource}")
    _all_known(inventory, ids, distinct, resource)
    for device_id in ids:
        device = inventory.get(device_id)
        if device is not None and not device.healthy:
            raise AllocationError(
                Code.FAILED_PRECONDITION, f"device {device_id} of {resource} is Unhealthy"
            )


def check_preferred(
    inventory: Inventory,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    resource: str,
) -> None:
    """A preferred-allocation request must be satisfiable from what it offers."""
    what = f"preferred allocation for {resource}"
    offered = _no_duplicates(available, what)
    included = _no_duplicates(must_include, what)
    _all_known(inventory, available, offered, resource)
    _all_known(inventory, must_include, included, resource)
    for device_id in must_include:
        if device_id not in offered:
            raise AllocationError(
                Code.INVALID_ARGUMENT,
                f"{what}: must-include device {device_id} is not among the available devices",
            )
    if size < 1 or size > len(available):
        raise AllocationError(
            Code.INVALID_ARGUMENT,
            f"{what}: allocation size {size} must be between 1 and the "
            f"{len(available)} available devices",
        )
    if size < len(must_include):
        raise AllocationError(
            Code.INVALID_ARGUMENT,
            f"{what}: allocation size {size} is smaller than the "
            f"{len(must_include)} must-include devices",
        )


def check_answer(
    answer: Sequence[str], available: Sequence[str], must_include: Sequence[str], size: int
) -> bool:
    """Whether a family's preferred answer keeps the contract (a guard against our own bugs)."""
    chosen = set(answer)
    return (
        len(answer) == size == len(chosen)
        and chosen <= set(available)
        and set(must_include) <= chosen
    )
