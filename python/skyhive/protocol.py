"""The control protocol between a client and `skyhive daemon` (package bridge):
4-byte big-endian length, then one JSON object; the shared memory's file
descriptor arrives with the daemon's "shm" reply."""

import json
import mmap
import os
import socket
import struct

from .errors import KINDS, DaemonError

VERSION = 1
MAX_MESSAGE_BYTES = 1 << 20


class Connection:
    """A connected Unix socket speaking the daemon's protocol."""

    def __init__(self, path, timeout=None, describe=lambda: ""):
        self._describe = describe
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except OSError as e:
            self.sock.close()
            raise DaemonError(f"cannot connect to the daemon's socket {path}: {e}{self._describe()}") from e

    def send(self, msg):
        body = json.dumps(msg, separators=(",", ":")).encode()
        if len(body) > MAX_MESSAGE_BYTES:
            raise DaemonError(f"message of {len(body)} bytes exceeds the protocol's {MAX_MESSAGE_BYTES}")
        try:
            self.sock.sendall(struct.pack(">I", len(body)) + body)
        except OSError as e:
            raise self._gone(e) from e

    def recv(self, with_fd=False):
        """Returns the next message (and the descriptor that came with it)."""
        fd = None
        try:
            if with_fd:
                hdr, fds, _, _ = socket.recv_fds(self.sock, 4, 1)
                fd = fds[0] if fds else None
                hdr += self._read(4 - len(hdr))
            else:
                hdr = self._read(4)
            (n,) = struct.unpack(">I", hdr)
            if n == 0 or n > MAX_MESSAGE_BYTES:
                raise DaemonError(f"the daemon sent a message of {n} bytes")
            msg = json.loads(self._read(n))
        except (OSError, EOFError, ValueError) as e:
            raise self._gone(e) from e
        if msg.get("op") == "error":
            if fd is not None:
                socket.close(fd)
            raise KINDS.get(msg.get("kind"), DaemonError)(msg.get("error", "the daemon reported an error"))
        return (msg, fd) if with_fd else msg

    def shared_memory(self):
        """Reads the daemon's "shm" reply and maps the region that came with
        it; returns the reply and the mapping."""
        msg, fd = self.recv(with_fd=True)
        if msg.get("op") != "shm" or fd is None:
            if fd is not None:
                os.close(fd)
            raise DaemonError(f"the daemon answered {msg.get('op')!r} without shared memory")
        try:
            return msg, mmap.mmap(fd, msg["bytes"])
        finally:
            os.close(fd)

    def _read(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError("the daemon closed the connection")
            buf += chunk
        return bytes(buf)

    def _gone(self, e):
        return DaemonError(f"lost the daemon ({e}): it exited or was killed; the model's parameters are untouched{self._describe()}")

    def close(self):
        self.sock.close()
