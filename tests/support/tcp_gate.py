"""TCP gates in front of a real server.

`TcpGate`: connections are held (accepted by the kernel, never answered) until the test opens
the gate, then forwarded both ways. A client connecting through a closed gate waits as it would
for a broker that is slow to answer: the way to prove that something does not wait for the
broker.

`TcpLink` (from `ckpt_ha.lab.devstack.tcp_link`, the one the embedded stack puts in front of S3):
connections are forwarded until the test cuts the link, then reset and refused until it is
restored: a server outage for the clients behind the link only.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

from ckpt_ha.lab.devstack.tcp_link import TcpLink

__all__ = ["TcpGate", "TcpLink"]


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
