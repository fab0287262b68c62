"""The simulated node: a sysfs tree in the kernel layout and a fake NVML, from a node file."""
