"""TCP gates in front of a real server.

`TcpGate`: connections are held (accepted by the kernel, never answered) until the test opens
the gate, then forwarded both ways. A client connecting through a closed gate waits as it would
for a broker that is slow to answer: the way to prove that something does not wait for the
broker.

`TcpLink`: connections are forwarded until the test cuts the link, then reset and refused until
it is restored: a server outage for the clients behind the link only.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType


class TcpGate:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._closed = False
        self._sockets: list[socket.socket] = [self._listener]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def open(self) -> None:
        """Forward the held connection(s) and every later one."""
        self._open.set()

    def _serve(self) -> None:
        self._open.wait()
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed = True
        self._open.set()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()

    def __enter__(self) -> TcpGate:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class TcpLink:
    """A TCP link to a real server that a test cuts and restores: the server's outage as its
    clients see it, for the clients behind the link only.

    Up, it forwards every connection both ways. `cut` drops every live connection and refuses
    (accepts, then resets) each new one until `restore`: what a client sees when the server or
    the path to it is gone. `trip_on` arms a trip wire: the link cuts itself the moment a client
    sends bytes containing a pattern (before they are forwarded), so an outage can start exactly
    when a client begins an operation (for S3: a request line naming ``quarantine/``, a
    ``DELETE``). The listening port stays the same throughout, as a server's address does.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._up = True
        self._stopped = False
        self._live: set[socket.socket] = set()
        self._wire: bytes | None = None
        self._tripped = threading.Event()
        self.cuts = 0
        """How many times the link was cut (by `cut` or a trip wire)."""
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def is_up(self) -> bool:
        return self._up

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Drop every live connection and refuse new ones until `restore`."""
        with self._lock:
            if not self._up:
                return
            self._up = False
            self.cuts += 1
            live, self._live = self._live, set()
        for s in live:
            _drop(s)

    def restore(self) -> None:
        with self._lock:
            self._up = True

    def trip_on(self, pattern: bytes) -> threading.Event:
        """Cut the link when a client next sends ``pattern``; the event is set when it has."""
        with self._lock:
            self._wire = pattern
            self._tripped = threading.Event()
            return self._tripped

    def disarm(self) -> None:
        with self._lock:
            self._wire = None

    def close(self) -> None:
        self._stopped = True
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()

    def _serve(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._up:
                _drop(client)
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                _drop(client)
                continue
            with self._lock:
                if not self._up:
                    _drop(client)
                    _drop(server)
                    continue
                self._live |= {client, server}
            ends = [2]  # both directions must end before the pair is closed
            for a, b, from_client in ((client, server, True), (server, client, False)):
                threading.Thread(
                    target=self._pump, args=(a, b, from_client, ends), daemon=True
                ).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, from_client: bool, ends: list[int]
    ) -> None:
        tail = b""
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                wire = self._wire if from_client else None
                if wire is not None and wire in tail + data:
                    with self._lock:
                        self._wire = None
                        tripped = self._tripped
                    self.cut()
                    tripped.set()
                    break
                if wire is not None:
                    tail = (tail + data)[-len(wire) :]
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        with self._lock:
            ends[0] -= 1
            if ends[0]:
                return
            self._live -= {src, dst}
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.close()


def _drop(s: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0): the peer sees the connection fail, not a clean end."""
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()
