"""The outside world behind Protocols: NVML, sysfs, netlink, inotify.

One real implementation each; the simulated twins live in agents/sim.
"""
