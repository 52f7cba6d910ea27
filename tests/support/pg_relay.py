"""A relay in front of the test PostgreSQL server (its unix socket) that can lose an answer:
`cut_after(marker)` lets the next client message holding `marker` through, swallows the
server's answer to it and closes that client's connection. The statement ran (and, in
autocommit, committed); the client only learns that its connection broke."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

READY = b"Z\x00\x00\x00\x05"  # ReadyForQuery: the server is done with what it was sent


class LosingRelay:
    def __init__(self, server_socket: Path, relay_dir: Path) -> None:
        self.path = relay_dir / server_socket.name  # the same ".s.PGSQL.<port>" name
        self._target = str(server_socket)
        self._marker: bytes | None = None
        self._lock = threading.Lock()
        self.cuts = 0
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.path))
        self._listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_after(self, marker: bytes) -> None:
        with self._lock:
            self._marker = marker

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self._target)
            cut = threading.Event()
            threading.Thread(target=self._up, args=(client, server, cut), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, cut), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, cut: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self._lock:
                    if self._marker is not None and self._marker in data:
                        self._marker = None
                        cut.set()
                server.sendall(data)
                if cut.is_set():
                    return
        server.close()

    def _down(self, server: socket.socket, client: socket.socket, cut: threading.Event) -> None:
        answered = b""
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if not cut.is_set():
                    client.sendall(data)
                    continue
                answered += data  # the answer to the marked message: swallowed
                if READY in answered:
                    self.cuts += 1
                    break
        for sock in (client, server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
