"""What `node-agent topo` says of GPU shares (docs/sharing.md#shares-under-dra):
the claims the GPU DRA driver has prepared on each GPU, read from its checkpoint without
changing it, and once for the node whether MPS enforces the shares' limits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from agents.config_shares import Shares
from agents.core.quantity import quantity
from agents.dra.claim_checkpoint import CHECKPOINT, CheckpointError, PreparedClaim, decode
from agents.dra.shares_note import read_note
from agents.gpu import mps_paths
from agents.gpu.discovery import Gpu
from agents.gpu.dra import COMPUTE, DRIVER, MEMORY
from agents.gpu.shares import MEMORY_LIMIT

VOLTA = (7, 0)  # the first compute capability whose MPS limits a client's memory and SMs


@dataclass(frozen=True)
class Held:
    """One prepared result on a whole GPU: a share (memory and compute as consumed) or the
    whole GPU; `limited`: whether its container was told MPS's limits."""

    claim: str  # namespace/name
    memory: str = ""
    compute: str = ""
    limited: bool = False
    whole: bool = False


def checkpoint_path(plugins_dir: Path) -> Path:
    return plugins_dir / DRIVER / CHECKPOINT


def read_held(path: Path) -> tuple[dict[str, list[Held]], str | None, bool]:
    """Blocking. What the checkpoint at `path` holds by device name (`gpu-<minor>`), a
    one-line note where it cannot be read, and whether the file is there. Read only: a
    garbled file is left where it is, for the agent to deal with."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return {}, None, False
    except PermissionError:
        return {}, f"{path} is not readable by this user: run topo as root", True
    except OSError as exc:
        return {}, f"{path} is unreadable: {exc.strerror or exc}", True
    try:
        claims = decode(text, path)
    except CheckpointError as exc:
        return {}, f"{path} cannot be read ({exc.reason}): prepared claims unknown", True
    return _held(claims), None, True


def _held(claims: dict[str, PreparedClaim]) -> dict[str, list[Held]]:
    out: dict[str, list[Held]] = {}
    for claim in sorted(claims.values(), key=lambda c: (c.namespace, c.name)):
        name = f"{claim.namespace}/{claim.name}"
        limited = MEMORY_LIMIT in claim.env
        for device in claim.devices:
            if device.share_id:
                memory, compute = device.consumed.get(MEMORY, ""), device.consumed.get(COMPUTE, "")
                held = Held(name, memory, compute, limited=limited)
            elif device.admin_access:
                continue  # never exclusive, and takes nothing
            else:
                held = Held(name, whole=True)
            out.setdefault(device.device, []).append(held)
    return out


def unenforced(shares: Shares, mps_found: bool, gpus: Sequence[Gpu]) -> tuple[str, list[str]]:
    """Why no GPU's shares are limited ("" where MPS may limit them), and the GPUs too
    old for MPS's limits where only some are."""
    if shares.enforce == "none":
        return "enforce: none", []
    if not mps_found:
        return "no nvidia-cuda-mps-control found", []
    old = [g for g in gpus if _before_volta(g.compute_capability)]
    if old and len(old) == len(gpus):
        return _older(old), []
    return "", [f"GPU{g.index}" for g in old]


def _older(gpus: Sequence[Gpu]) -> str:
    said = ", ".join(f"GPU{g.index} ({g.compute_capability})" for g in gpus)
    return f"compute capability older than Volta (7.0): {said}"


def _before_volta(capability: str) -> bool:
    """Whether a compute capability ("6.1") is below Volta's; "" (unknown) is not."""
    try:
        major, minor = (int(p) for p in capability.split("."))
    except ValueError:
        return False
    return (major, minor) < VOLTA


def shares_report(
    shares: Shares | None, mps_found: bool, gpus: Sequence[Gpu], plugins_dir: Path
) -> dict[str, Any] | None:
    """Blocking. The report's `shares`; None where there is nothing to say: no shares in
    the config topo read and no checkpoint."""
    path = checkpoint_path(plugins_dir)
    held, note, there = read_held(path)
    unavailable = read_note(plugins_dir, DRIVER)
    if shares is None and not there and unavailable is None:
        return None
    if not there:
        note = "no checkpoint there: no claim prepared yet (or another --kubelet-plugins-dir)"
    names = {f"gpu-{g.minor}": f"GPU{g.index}" for g in gpus}
    by_gpu = {names[d]: [asdict(h) for h in hs] for d, hs in held.items() if d in names}
    if shares is None:
        enforced, limits = None, "as each share says (no sharing.shares in the config topo read)"
        quiet = note is None and unavailable is None
        if quiet and all(h["whole"] for hs in by_gpu.values() for h in hs):
            return None  # whole GPUs only, and no shares in the config: none to show
    else:
        why, old = unenforced(shares, mps_found, gpus)
        enforced = not why
        pipe = mps_paths.pipe_dir(shares.mps_root, DRIVER)
        limits = (
            f"not enforced: {why}"
            if why
            else f"by MPS, per client process, where a daemon serves {pipe}"
        )
        if old:
            limits += f"; not on {', '.join(old)} (older than Volta)"
    return {
        "configured": shares is not None,
        "enforced": enforced,
        "limits": limits,
        "checkpoint": str(path),
        "note": note,
        "unavailable": unavailable,
        "gpus": by_gpu,
        "used": {gpu: _used(hs) for gpu, hs in by_gpu.items()},
    }


def _used(held: list[dict[str, Any]]) -> dict[str, int]:
    """The memory (MiB) and compute (%) a GPU's shares take together."""
    memory = sum((_number(h["memory"]) for h in held), Fraction(0))
    compute = sum((_number(h["compute"]) for h in held), Fraction(0))
    return {"memoryMiB": int(memory) // 2**20, "compute": int(compute)}


def _number(text: str) -> Fraction:
    value = quantity(text) if text else Fraction(0)
    return value if isinstance(value, Fraction) else Fraction(0)


def render_shares(report: dict[str, Any], memory_mib: dict[str, int]) -> list[str]:
    """The Shares section of the text report; `memory_mib`: each GPU's memory by name."""
    lines = ["", f"Shares (prepared claims: {report['checkpoint']})"]
    if report["note"]:
        lines.append(f"  {report['note']}")
    for gpu, held in report["gpus"].items():
        used = report["used"][gpu]
        shared = [h for h in held if not h["whole"]]
        for h in held:
            if h["whole"]:
                lines.append(f"  {gpu:<8} whole GPU, claim {h['claim']}")
        if shared:
            total = f"memory {used['memoryMiB']} of {memory_mib.get(gpu, 0)} MiB"
            count = f"{len(shared)} share{'s' if len(shared) > 1 else ''}"
            lines.append(f"  {gpu:<8} {count}, {total}, compute {used['compute']} %")
        lines += [f"    {h['claim']:<24} {_share(h)}" for h in shared]
    if not report["gpus"] and report["note"] is None:
        lines.append("  no claim prepared on a GPU")
    lines.append(f"  limits: {report['limits']}")
    if report["unavailable"]:
        lines.append(f"  unavailable: {report['unavailable']}: a GPU goes to one claim at a time")
    return lines


def _share(held: dict[str, Any]) -> str:
    compute = f"compute {held['compute']} %" if _number(held["compute"]) else "compute -"
    told = "MPS limits" if held["limited"] else "no MPS limits"
    return f"memory {held['memory'] or '-':<7} {compute:<13} {told}"
