"""The RoCE family: RDMA-capable Ethernet NIC functions from sysfs, link health from netlink."""
