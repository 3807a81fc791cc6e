"""A webhook receiver for the tests: a threaded HTTP server on loopback that records every
request (headers and body) and answers from a script of status codes (200 once the script
runs out), after an optional delay."""

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    statuses: list[int] = field(default_factory=list)
    delay: float = 0.0
    requests: list[Received] = field(default_factory=list)
    url: str = ""

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.requests)} of {count} requests arrived")
            time.sleep(0.05)
        return self.requests


def serve(receiver: Receiver):
    """Start `receiver` on a free loopback port; answers (server, thread)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            receiver.requests.append(
                Received(self.path, dict(self.headers.items()), body, time.time())
            )
            time.sleep(receiver.delay)
            status = receiver.statuses.pop(0) if receiver.statuses else 200
            answer = b'{"received": true}' if status < 300 else b"receiver is down"
            self.send_response(status)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/gpucloud"
    return server, thread
