"""`m3bench serve`'s app on a thread of the test process, on a free local port (for in-process server tests)."""

import threading
import time
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def serving(engine, cfg) -> Iterator[str]:
    """Serve create_app(engine, cfg) on 127.0.0.1; yields the base URL; stops the server on exit."""
    from m3bench.bench.server import create_app, uvicorn_server

    server = uvicorn_server(create_app(engine, cfg), "127.0.0.1", 0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
