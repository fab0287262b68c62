"""Prints, as JSON, the GPU family's DRA devices as the real NVML backend (pynvml) finds
them on this process's NVML library. Run as `python -m tests.integration.dra_probe`."""

from __future__ import annotations

import dataclasses
import json

from agents.config import Config
from agents.gpu.family import GpuFamily
from agents.gpu.kind import GpuKind, discover_gpus, give_back
from agents.hw.nvml_backend import NvmlBackend
from agents.hw.sysfs import Sysfs
from agents.kernel.facts import Version


def main() -> None:
    nvml = NvmlBackend()
    config = GpuKind().named_devices(Config.default())
    found = discover_gpus(nvml, Sysfs(), config, "probe")
    try:
        published = GpuFamily(nvml, found, config).facts()
    finally:
        give_back(nvml)
    devices = [
        {
            **dataclasses.asdict(d),
            "attributes": {
                k: {"version": v.value} if isinstance(v, Version) else v
                for k, v in d.attributes.items()
            },
        }
        for d in published.devices
    ]
    print(json.dumps({"driver": published.driver, "devices": devices}))


if __name__ == "__main__":
    main()
