"""A TCP link in front of a real server that loses the answer to the first request it carries:
the request reaches the server whole, the server acts on it, and the client's connection is
closed instead of the response. The way to prove a retry copes with its own earlier success.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class LossyLink:
    """Forwards every connection to ``upstream``; on the first one, the first bytes the server
    sends back are dropped and both sockets closed. ``dropped`` counts such losses (0 or 1)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.dropped = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._closed = False
        self._sockets: list[socket.socket] = [self._listener]
        self._first = True
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._sockets += [client, server]
            lose_answer, self._first = self._first, False
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            back = self._drop_answer if lose_answer else self._pump
            threading.Thread(target=back, args=(server, client), daemon=True).start()

    def _drop_answer(self, server: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            # An interim "100 Continue" only invites the body: pass it on. The next answer is
            # the final one, so the request has been carried out.
            while (data := server.recv(65536)).startswith(b"HTTP/1.1 100 ") and data.endswith(
                b"\r\n\r\n"
            ):
                client.sendall(data)
        self.dropped += 1
        for s in (client, server):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # wakes the other pump; close alone would not
                s.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed = True
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()

    def __enter__(self) -> LossyLink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
