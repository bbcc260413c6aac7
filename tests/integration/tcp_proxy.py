"""A loopback TCP proxy a drill controls: one controller reaches PostgreSQL through
it, and ``cut()`` blackholes every connection (bytes are no longer passed either way,
nothing is closed), as a one-sided network partition does: that controller's queries
hang while the other controller, and Slurm, are still reachable."""

from __future__ import annotations

import selectors
import socket
import threading


class TcpProxy:
    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self._listener = socket.create_server((host, 0))
        self.port = int(self._listener.getsockname()[1])
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, name="tcp-proxy", daemon=True)
        self._thread.start()

    def cut(self) -> None:
        """From now on no byte passes, new connections included (they are accepted,
        then left unanswered)."""
        self._cut.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            for s in self._sockets:
                s.close()
        self._listener.close()

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        self._listener.setblocking(False)
        sel.register(self._listener, selectors.EVENT_READ, None)
        while not self._stop.is_set():
            for key, _ in sel.select(timeout=0.1):
                if key.data is None:
                    self._accept(sel)
                elif not self._cut.is_set():
                    self._pass(sel, key.fileobj, key.data)  # type: ignore[arg-type]
        sel.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        client, _ = self._listener.accept()
        with self._lock:
            self._sockets.append(client)
        if self._cut.is_set():
            return  # held open and never answered
        upstream = socket.create_connection(self.target, timeout=5)
        with self._lock:
            self._sockets.append(upstream)
        for a, b in ((client, upstream), (upstream, client)):
            a.setblocking(False)
            sel.register(a, selectors.EVENT_READ, b)

    def _pass(self, sel: selectors.BaseSelector, src: socket.socket, dst: socket.socket) -> None:
        try:
            data = src.recv(65536)
        except OSError:
            data = b""
        if not data:
            for s in (src, dst):
                try:
                    sel.unregister(s)
                except (KeyError, ValueError):
                    pass
                s.close()
            return
        dst.setblocking(True)
        try:
            dst.sendall(data)
        except OSError:
            pass
        finally:
            dst.setblocking(False)
