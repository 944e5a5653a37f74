"""A TCP link to a real server that can be cut and restored: a storage outage on demand.

`TcpLink` forwards connections to an upstream server until it is cut. The embedded stack puts one
in front of an S3-compatible server (``ckpt-ha up --storage s3://…`` / ``ckpt-ha drill --storage
s3://…``): the services and the drill's jobs reach S3 through it, so the storage-outage drill can
take S3 away from exactly them, as moving a filesystem root away does for a local root. The fault
suite uses the same class in-process.

As a process (``python -m ckpt_ha.lab.devstack.tcp_link --port P --upstream HOST:PORT --state F``,
what `ckpt_ha.lab.devstack.stack` starts): SIGUSR1 cuts the link, SIGUSR2 restores it, and after
each change the file ``F`` says ``up`` or ``down`` (`ckpt_ha.lab.devstack.stack.cut_storage` and
`restore_storage` signal it and wait for that).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import struct
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

UP, DOWN = "up", "down"
"""What the state file of a link process says."""


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

    def __init__(self, upstream: tuple[str, int], port: int = 0) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", port))
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


def _write_state(path: Path, value: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(value)
    tmp.replace(path)


def serve(argv: Sequence[str] | None = None) -> None:
    """The link as a process: forward until SIGTERM; SIGUSR1 cuts, SIGUSR2 restores."""
    p = argparse.ArgumentParser(prog="python -m ckpt_ha.lab.devstack.tcp_link")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, metavar="HOST:PORT")
    p.add_argument("--state", type=Path, required=True)
    args = p.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    link = TcpLink((host, int(port)), port=args.port)
    state: Path = args.state
    _write_state(state, UP)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGUSR1:
            link.cut()
            _write_state(state, DOWN)
        elif signum == signal.SIGUSR2:
            link.restore()
            _write_state(state, UP)
        else:
            link.close()
            raise SystemExit(0)

    for signum in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    print(f"forwarding 127.0.0.1:{link.port} to {args.upstream}", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    serve()
