"""The tier's socket check (``foreign_sockets``) sees a socket of another namespace, and
only that: a socket of this namespace that no ``/proc/net`` table lists is not foreign.

The second case failed the tier once: a test upstream's handler held a connection a killed
proxy had reset, and a check by elimination against the tables called it a sandbox's.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
import time
from pathlib import Path

from tests.network.conftest import foreign_sockets

CLONE_NEWNET = 0x40000000


def _inode(sock: socket.socket) -> int:
    return os.fstat(sock.fileno()).st_ino


def _listed(inode: int) -> bool:
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/self/net/{table}").read_text().splitlines()[1:]:
            if line.split()[9] == str(inode):
                return True
    return False


def test_a_socket_made_in_another_namespace_is_foreign() -> None:
    made: list[socket.socket] = []
    errors: list[int] = []

    def elsewhere() -> None:
        # unshare() moves only this thread; the socket outlives it in the process
        if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) != 0:
            errors.append(ctypes.get_errno())
            return
        made.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert not errors, errors
    (sock,) = made
    try:
        assert _inode(sock) in foreign_sockets(os.getpid())
    finally:
        sock.close()
    assert foreign_sockets(os.getpid()) == set()


def test_a_reset_connection_of_this_namespace_is_not_foreign() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        with accepted:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # linger 0: an RST, and the accepted end goes to CLOSE
            deadline = time.monotonic() + 5
            while _listed(_inode(accepted)) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not _listed(_inode(accepted))  # in no table, still open here
            assert _inode(accepted) not in foreign_sockets(os.getpid())
