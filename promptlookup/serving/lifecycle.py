"""Running the server: the port bound before anything is loaded, and a bounded shutdown.

:func:`bind` takes the port first, so a busy one is a one-line error (exit code 2) before
the model loads and before anything says it serves.

:class:`DrainingServer` is uvicorn's server with this shutdown, the same for SIGTERM and
the first SIGINT:

1. stop accepting: new requests get 503 (``/health`` too), while the listener stays open;
2. let the requests in flight finish, for at most ``shutdown_timeout`` seconds;
3. end the rest: each gets an error event in its stream (503 when not streamed), and
   leaves the batch, freeing its KV blocks, at the scheduler's next step;
4. close the listener and the connections (waiting at most :data:`FLUSH_SECONDS` for the
   error events to go out), and return, so that the caller saves the dynamic n-gram
   cache and exits 0.

A second signal does step 3 at once. Unlike uvicorn's own handler, the signal is not
raised again after the shutdown: the process exits 0 with its work saved. The bound:
``shutdown_timeout`` plus one scheduler step plus :data:`FLUSH_SECONDS`.
"""
from __future__ import annotations

import contextlib
import errno
import signal
import socket
import sys
import threading
import time
from typing import Any, Generator

import uvicorn

from ..errors import UserError
from .openai_server import OpenAIServer

FLUSH_SECONDS = 5.0  # after the last requests were ended: time for their error events to go out


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (``port`` 0: a free one) and listening; a busy port or
    a host that is not this machine's is a :class:`UserError` naming the flag to change."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UserError(f"--host {host!r} does not resolve ({exc.strerror}); pass an address such as 127.0.0.1") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)  # connections queue from now on, until uvicorn accepts them
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"port {port} on {host} is already in use; stop what holds it or pass another --port "
                            "(0: any free port)") from None
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror}); check --host and --port") from None
    return sock


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the bounded shutdown of the module docstring."""

    def __init__(self, config: uvicorn.Config, api: OpenAIServer, shutdown_timeout: float) -> None:
        super().__init__(config)
        self.api = api
        self.shutdown_timeout = shutdown_timeout
        self.signals = 0
        self.deadline: float | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: Any) -> None:
        """Signal handler: only counts (the event loop's tick does the work)."""
        self.signals += 1

    def request_shutdown(self) -> None:
        """As a signal (for callers without one, e.g. tests running it in a thread)."""
        self.signals += 1

    async def on_tick(self, counter: int) -> bool:
        if self.signals and self.deadline is None:
            self.deadline = time.monotonic() + self.shutdown_timeout
            self.api.begin_drain()
            print(f"shutting down: new requests get 503; in-flight ones have {self.shutdown_timeout:g} s to finish "
                  "(a second signal ends them now)", file=sys.stderr, flush=True)
        if self.deadline is not None and not self.should_exit:
            if self.api.idle():
                self.should_exit = True
            elif self.signals > 1 or time.monotonic() >= self.deadline:
                ended = self.api.abort_inflight()
                print(f"shutting down: ended {ended} unfinished request(s) with an error", file=sys.stderr, flush=True)
                self.should_exit = True
        return await super().on_tick(counter)


def serve(api: OpenAIServer, sock: socket.socket, shutdown_timeout: float, log_level: str = "info") -> DrainingServer:
    """Serve ``api`` on the bound ``sock`` until a signal's shutdown completes (blocking)."""
    config = uvicorn.Config(api.app, log_level=log_level, lifespan="off", timeout_graceful_shutdown=int(FLUSH_SECONDS))
    server = DrainingServer(config, api, shutdown_timeout)
    server.run(sockets=[sock])
    return server
