"""The raw socket that receives LLDP frames on one netdev: AF_PACKET bound to its ifindex,
the nearest-bridge group joined so a NIC that filters multicast passes the frames up."""

from __future__ import annotations

import socket
import struct

from agents.hw.lldp import ETHERTYPE_LLDP, MAX_FRAME_BYTES, NEAREST_BRIDGE

RECV_SIZE = MAX_FRAME_BYTES

# from <linux/if_packet.h>
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_MULTICAST = 0


class LldpSocket:
    """A non-blocking AF_PACKET socket hearing LLDP on `ifname` only, as bound at `index`."""

    def __init__(self, sock: socket.socket, ifname: str, index: int) -> None:
        self._sock, self.ifname, self.index = sock, ifname, index

    def fileno(self) -> int:
        return self._sock.fileno()

    def receive(self, buffer: bytearray) -> int | None:
        """The next frame's full length (the buffer holds its start), or None for a frame
        this host sent out itself; BlockingIOError when none waits, OSError on failure."""
        size, address = self._sock.recvfrom_into(buffer, len(buffer), socket.MSG_TRUNC)
        return None if address[2] == socket.PACKET_OUTGOING else size

    def still_bound(self) -> bool:
        """The netdev of this name is still the one the socket is bound to (neither removed
        nor renamed, nor replaced by a new netdev of the same name)."""
        try:
            return socket.if_nametoindex(self.ifname) == self.index
        except OSError:
            return False

    def close(self) -> None:
        self._sock.close()


def open_lldp_socket(ifname: str) -> LldpSocket:
    """The LLDP socket of `ifname`: PermissionError without CAP_NET_RAW, OSError (ENODEV)
    where there is no such netdev. Nothing here waits on the network."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # 0: hears nothing yet
    try:
        index = socket.if_nametoindex(ifname)
        # bind() names the netdev; if a netdev of that name replaced it in between, the
        # index check below fails and the caller tries again later.
        sock.bind((ifname, ETHERTYPE_LLDP))
        if socket.if_nametoindex(ifname) != index:
            raise OSError(f"{ifname} was replaced while binding")
        membership = struct.pack("iHH8s", index, PACKET_MR_MULTICAST, 6, NEAREST_BRIDGE)
        sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, membership)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return LldpSocket(sock, ifname, index)
