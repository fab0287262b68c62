"""Whether the API server keeps the devices a DRA driver offers to several claims at once
(`allowMultipleAllocations`): a note in the driver's plugins directory, written as the
agent first publishes the driver's slices, for `node-agent topo` to say that shares are
unavailable (docs/sharing.md#shares-under-dra). Blocking file I/O: off the event loop."""

from __future__ import annotations

from pathlib import Path

import structlog

from agents.atomic_file import write_atomically

log = structlog.get_logger(__name__)

NOTE = "shares-unavailable"
NOTE_MODE = 0o644  # topo may read it as any user


def note_path(plugins_dir: Path, driver: str) -> Path:
    return plugins_dir / driver / NOTE


def record(plugins_dir: Path, driver: str, reason: str | None) -> None:
    """Note `reason` why the driver's shares are unavailable; None: remove the note (they
    are, or none is offered). A note that cannot be written is logged, never raised."""
    path = note_path(plugins_dir, driver)
    try:
        if reason is None:
            path.unlink(missing_ok=True)
        else:
            write_atomically(path, reason.encode() + b"\n", NOTE_MODE)
    except OSError as exc:
        log.warning("dra_shares_note_unwritable", path=str(path), reason=str(exc))


def read_note(plugins_dir: Path, driver: str) -> str | None:
    """The reason noted; None without a note, or where it cannot be read."""
    try:
        return note_path(plugins_dir, driver).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None
