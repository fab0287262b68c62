"""The GPU family: whole GPUs, time-shared replicas and MIG instances through NVML."""
