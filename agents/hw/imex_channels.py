"""Where an IMEX channel's character device is, looked for as NVIDIA's device plugin
v0.20 looks: under the driver's root when that holds a dev/, and under /dev."""

from __future__ import annotations

import os
import posixpath
import stat

from agents.errors import BackendError

CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"


def channel_path(channel: int) -> str:
    """The channel's device node, as a container sees it."""
    return f"{CHANNEL_DIR}/channel{channel}"


def find_channel(root: str, driver_root: str, channel: int) -> str:
    """Blocking. The path under `root` ("" on a real node) where `channel` is a character
    device; raises BackendError saying what was found instead."""
    path = channel_path(channel)
    dev_root = driver_root if os.path.isdir(root + posixpath.join(driver_root, "dev")) else "/"
    places = dict.fromkeys((posixpath.join(dev_root, path.lstrip("/")), path))
    problems = []
    for place in places:
        try:
            mode = os.stat(root + place).st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.append(f"{place}: {exc.strerror}")
            continue
        if stat.S_ISCHR(mode):
            return root + place
        problems.append(f"{place} is not a character device")
    raise BackendError("; ".join(problems) or f"no {' nor '.join(places)}")
