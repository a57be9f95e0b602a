"""A served instance for black-box tests: gunicorn with 2 sync workers on the test
database, and nginx in front of it with the shipped ``deploy/nginx.conf``."""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.db import connection

from tests.bench.server import GunicornServer, free_port
from tests.support.paths import REPO
from tests.support.threads import InBackground

NGINX_SITE = REPO / "deploy" / "nginx.conf"


@dataclass(frozen=True)
class Served:
    host: str
    port: int


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def wait_listening(port: int, *, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not listening(port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listens on port {port} after {seconds} s")
        time.sleep(0.05)


@contextlib.contextmanager
def served_gunicorn(log: Path, **environ: str) -> Iterator[Served]:
    """``project.wsgi`` under gunicorn (2 sync workers), on the test database, with
    ``environ`` added to its environment (tests/settings.py reads some)."""
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url}
    env.pop("GUNICORN_CMD_ARGS", None)
    env.update(environ)
    with GunicornServer(env, log) as server:
        yield Served(server.host, server.port)


@pytest.fixture
def gunicorn(transactional_db, tmp_path) -> Iterator[Served]:
    """gunicorn on its own, as `make run` serves it: no proxy is trusted."""
    with served_gunicorn(tmp_path / "gunicorn.log") as server:
        yield server


@pytest.fixture
def nginx_with_probes(transactional_db, tmp_path) -> Iterator[Served]:
    """nginx with deploy/nginx.conf before two gunicorns, as docs/deploying.md runs
    them: the senders' and the probes' own."""
    app_log, probes_log = tmp_path / "gunicorn.log", tmp_path / "probes.log"
    with (
        served_gunicorn(app_log, WEBHOOK_TRUSTED_PROXIES="1") as app,
        served_gunicorn(probes_log) as probes,
    ):
        yield from _nginx_before(app, probes)


@pytest.fixture
def nginx(transactional_db, tmp_path) -> Iterator[Served]:
    """nginx with deploy/nginx.conf, in front of gunicorn, which trusts it as the one
    proxy in front (TRUSTED_PROXIES = 1), as a deployment behind it does."""
    with served_gunicorn(tmp_path / "gunicorn.log", WEBHOOK_TRUSTED_PROXIES="1") as upstream:
        yield from _nginx_before(upstream)


def _nginx_before(gunicorn: Served, probes: Served | None = None) -> Iterator[Served]:
    """nginx with deploy/nginx.conf before ``gunicorn``, which stands for both of the
    file's pools (the senders' and the probes') unless ``probes`` is given."""
    binary = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if binary is None:
        pytest.skip("needs nginx (apt-get install nginx-light; .ci/run installs it)")
    port = free_port()
    site = NGINX_SITE.read_text()
    probes = probes or gunicorn
    for shipped, pool in (("server 127.0.0.1:8000;", gunicorn), ("server 127.0.0.1:8001;", probes)):
        site = site.replace(shipped, f"server {pool.host}:{pool.port};")
    site = site.replace("listen 80;", f"listen 127.0.0.1:{port};")
    # nginx's workers may run as another user: its scratch space must be theirs too
    scratch = Path(tempfile.mkdtemp(prefix="webhook-nginx-"))
    scratch.chmod(0o777)
    temp_paths = "\n".join(
        f"{kind}_temp_path {scratch / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    config = scratch / "nginx.conf"
    config.write_text(
        f"worker_processes 1;\npid {scratch / 'nginx.pid'};\nerror_log {scratch / 'error.log'};\n"
        # Debian's own main config: a site file has to hold up without tuning it
        "events { worker_connections 768; }\n"
        f"http {{\naccess_log off;\n{temp_paths}\n{site}\n}}\n"
    )
    process = subprocess.Popen(
        [binary, "-p", str(scratch), "-c", str(config), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_listening(port)
        yield Served("127.0.0.1", port)
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(scratch, ignore_errors=True)


# --- a slow-body flood: many connections from one address, each dribbling its body ----

# Loopback answers on all of 127/8: a flood from here is "another client" to nginx.
FLOOD_ADDRESS = "127.0.0.2"


@dataclass
class SlowBodyFlood(InBackground):
    """``connections`` connections from FLOOD_ADDRESS, kept open: each sends a request
    header (announcing ``body_size`` bytes), then one body byte every ``interval``
    seconds; one the server ends (answered or not) is replaced by a new one at once.
    The slow-body attack, by an attacker who keeps its connections. One
    thread and a selector carry them all. ``answers`` counts the statuses the server
    sent, and ``dropped`` the connections it ended without one (or never accepted)."""

    server: Served
    connections: int
    interval: float
    body_size: int = 1000
    answers: Counter[int] = field(default_factory=Counter)
    dropped: int = 0

    HEAD = (
        b"POST /webhooks/shop/ HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    )

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        # socket -> whether its header is still to be sent
        pending: dict[socket.socket, bool] = {}

        def open_one() -> None:
            sock = socket.socket()
            sock.bind((FLOOD_ADDRESS, 0))
            sock.setblocking(False)
            sock.connect_ex((self.server.host, self.server.port))
            pending[sock] = True
            selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)

        def close(sock: socket.socket) -> None:
            selector.unregister(sock)
            del pending[sock]
            sock.close()

        for _ in range(self.connections):
            open_one()
        next_byte = time.monotonic() + self.interval
        while not self._stop.is_set():
            for key, events in selector.select(timeout=0.1):
                sock = key.fileobj
                if events & selectors.EVENT_READ:  # an answer, a reset or a close
                    self._count(sock)
                    close(sock)
                    open_one()
                elif pending[sock]:  # connected: send the header, once
                    try:
                        sock.send(self.HEAD % self.body_size)
                    except OSError:
                        continue
                    pending[sock] = False
                    selector.modify(sock, selectors.EVENT_READ)
            if time.monotonic() >= next_byte:
                next_byte += self.interval
                for sock, header_due in list(pending.items()):
                    if not header_due:
                        with contextlib.suppress(OSError):  # a reset: counted when read
                            sock.send(b" ")
        for sock in list(pending):
            close(sock)

    def _count(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(1024)
        except OSError:
            data = b""
        if data.startswith(b"HTTP/1.1 "):
            self.answers[int(data.split(b" ", 2)[1])] += 1
        else:
            self.dropped += 1
