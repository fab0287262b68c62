"""Whether a PCI function is a vGPU, from its configuration space, as GFD v0.20 reads it:
the vendor-specific capability signed "VF", and the host driver record inside it."""

from __future__ import annotations

from agents.core.gfd_facts import VgpuHost

_STATUS, _CAP_LIST, _VENDOR_CAP = 0x06, 0x34, 0x09
_HAS_CAPS = 0x10
_RECORDS = 5  # where the vGPU capability's records begin
_TEXT = 10  # the host driver version and branch: 10 bytes each


def vendor_capability(config: bytes) -> bytes | None:
    """The vendor-specific capability of a function's config space, None without one.
    ValueError when less than 256 bytes were readable (reading all needs privilege)."""
    if len(config) < 256:
        raise ValueError("PCI config space not fully readable (needs privilege)")
    if not config[_STATUS] & _HAS_CAPS:
        return None
    seen: set[int] = set()
    pos = config[_CAP_LIST]
    while pos and pos not in seen and pos + 2 < len(config):
        ident, following, length = config[pos], config[pos + 1], config[pos + 2]
        if ident == 0xFF:
            break  # a broken chain
        if ident == _VENDOR_CAP:
            return config[pos : pos + length]
        seen.add(pos)
        pos = following
    return None


def vgpu_host(capability: bytes) -> VgpuHost | None:
    """The host driver of a vGPU's capability; None when it is not a vGPU's ("VF") or
    holds no driver record."""
    if len(capability) < 5 or capability[3:5] != b"VF":
        return None
    pos = _RECORDS
    while pos < len(capability) and capability[pos] != 0:
        step = capability[pos + 1] if pos + 1 < len(capability) else 0
        if step == 0:
            return None
        pos += step
    end = pos + 2 + 2 * _TEXT
    if pos >= len(capability) or end > len(capability):
        return None
    version = capability[pos + 2 : pos + 2 + _TEXT]
    branch = capability[pos + 2 + _TEXT : end]
    return VgpuHost(_text(version), _text(branch))


def _text(raw: bytes) -> str:
    return raw.decode("latin-1").strip("\x00")
