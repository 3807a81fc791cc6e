"""A container engine's socket that a test can take away and give back: a Unix socket that
forwards every connection to the engine's, byte for byte (its event stream too), from threads
of this process. `cut()` closes it and every connection through it, as an engine that stopped
answering would (the engine itself, shared by the worker's other tests, keeps running);
`restore()` serves it again."""

import contextlib
import socket
import threading
from pathlib import Path


class EngineProxy:
    def __init__(self, engine_url: str, path: Path):
        self.target = engine_url.removeprefix("unix://")
        self.path = path
        self.url = f"unix://{path}"
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._server: socket.socket | None = None

    def restore(self) -> None:
        self.path.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(self.path))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            server, self._server = self._server, None
            connections, self._open = self._open, []
        if server is not None:
            server.close()
        self.path.unlink(missing_ok=True)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
            connection.close()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:  # cut
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._server is not server:
                    client.close()
                    upstream.close()
                    return
                self._open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(source, sink), daemon=True).start()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
