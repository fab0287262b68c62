"""The IMEX channels every GPU container gets in device-plugin mode, as NVIDIA's device
plugin v0.20 hands them out (docs/configuration.md#imex-channels): found once at
discovery, then named in each container's edits beside its GPUs."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from agents.config import Imex
from agents.errors import BackendError, ConfigError
from agents.hw.imex_channels import find_channel
from agents.kernel.edits import Companions

log = structlog.get_logger(__name__)

VARIABLE = "NVIDIA_IMEX_CHANNELS"  # what NVIDIA's runtime hook reads the channels from
MOUNT_SUBDIR = "imex"  # with volume-mounts: one file per channel in this folder
CDI_KIND = "nvidia.com/imex-channel"


def imex_channels(imex: Imex, driver_root: str, root: str, source: str) -> tuple[int, ...]:
    """Blocking. The configured channels this node has (`root`: the simulator's, "" on a
    real node). A missing one stops the agent when required (a ConfigError, as NVIDIA's
    plugin refuses to start); otherwise it is left out, with a warning."""
    found = []
    for channel in imex.channel_ids:
        try:
            path = find_channel(root, driver_root, channel)
        except BackendError as exc:
            if imex.required:
                raise ConfigError(
                    source,
                    "imex.channelIDs",
                    f"IMEX channel {channel} on this node (imex.required), found {exc}",
                ) from exc
            log.warning(
                "imex_channel_missing",
                channel=channel,
                reason=str(exc),
                effect="GPU containers get no IMEX channel",
            )
            continue
        log.info("imex_channel_found", channel=channel, path=path)
        found.append(channel)
    return tuple(found)


def companions(channels: Sequence[int]) -> tuple[Companions, ...]:
    """The channels as the runtime hook is told them, beside the GPUs."""
    if not channels:
        return ()
    return (Companions(VARIABLE, tuple(str(c) for c in channels), MOUNT_SUBDIR),)


def cdi_names(channels: Sequence[int]) -> tuple[str, ...]:
    return tuple(f"{CDI_KIND}={c}" for c in channels)
