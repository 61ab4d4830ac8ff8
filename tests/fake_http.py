"""The HTTP side of the fakes of Google's REST services (tests/fake_compute.py,
tests/fake_metadata.py): a threaded server on loopback that hands each request to the fake's
`answer(method, path, headers, body) -> (status, body, headers)`."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

Answer = Callable[[str, str, object, bytes], tuple[int, bytes, dict[str, str]]]


class FakeHttpServer:
    def __init__(self, answer: Answer, methods: tuple[str, ...]):
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(answer, methods))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(answer: Answer, methods: tuple[str, ...]) -> type[BaseHTTPRequestHandler]:
    def serve(self: BaseHTTPRequestHandler) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        status, out, extra = answer(self.command, self.path, self.headers, body)
        try:
            self.send_response(status)
            for k, v in extra.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting (a stalled answer)

    def quiet(self, *args) -> None:  # each fake keeps its own request log
        pass

    # A method the fake does not serve is answered 501, as the standard handler does.
    return type("Handler", (BaseHTTPRequestHandler,), {**{f"do_{m}": serve for m in methods}, "log_message": quiet})
