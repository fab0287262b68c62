"""Pure logic: devices, topology, distances, pairing, preferred allocation, XID policy.

Nothing here touches grpc, hardware, the clock or the event loop.
"""
