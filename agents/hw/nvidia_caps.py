"""The capability devices a container needs to use a MIG instance.

A process opens a MIG instance through two character devices besides its GPU's
/dev/nvidia<minor>: the access capability of its GPU instance and that of its compute
instance, /dev/nvidia-caps/nvidia-cap<N>. The driver names N for each in
/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access and .../gi<G>/ci<C>/access
("DeviceFileMinor: N", one field per line).
"""

from __future__ import annotations

import re

from agents.errors import BackendError
from agents.hw.nvml import MigInstance

CAPABILITIES = "/proc/driver/nvidia/capabilities"
CAP_DEVICE = "/dev/nvidia-caps/nvidia-cap"
_MINOR = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)


def access_files(gpu_minor: int, mig: MigInstance) -> tuple[str, str]:
    """The driver's access files of `mig`'s GPU instance and compute instance."""
    gi = f"{CAPABILITIES}/gpu{gpu_minor}/mig/gi{mig.gpu_instance}"
    return f"{gi}/access", f"{gi}/ci{mig.compute_instance}/access"


def mig_cap_devices(root: str, gpu_minor: int, mig: MigInstance) -> tuple[str, str]:
    """Container paths of the two capability devices of `mig`, read from the access
    files under `root` ("" on a real node). Raises BackendError naming the file."""
    gpu_instance, compute_instance = access_files(gpu_minor, mig)
    return _device(root, gpu_instance), _device(root, compute_instance)


def _device(root: str, path: str) -> str:
    try:
        with open(root + path, encoding="ascii") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not ASCII text"
        raise BackendError(f"{path}: {reason}") from exc
    found = _MINOR.search(text)
    if found is None:
        raise BackendError(f"{path}: no DeviceFileMinor line")
    return f"{CAP_DEVICE}{int(found.group(1))}"
