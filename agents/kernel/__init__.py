"""The serving kernel: what every kubelet API runtime (agents/plugin, agents/dra) stands
on and no runtime owns: the device catalogue and neutral device facts, the unix-socket
gRPC server lifecycle, versioned state, the hand-over of devices between APIs, the
kubelet's facts and telemetry."""
