"""A served instance for black-box tests: gunicorn with 2 sync workers on the test
database, and nginx in front of it with the shipped ``deploy/nginx.conf``."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connection

from tests.bench.server import GunicornServer, free_port

BASE_DIR = Path(__file__).resolve().parent.parent
NGINX_SITE = BASE_DIR / "deploy" / "nginx.conf"


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


@pytest.fixture
def gunicorn(transactional_db, tmp_path) -> Iterator[Served]:
    """``project.wsgi`` under gunicorn (2 sync workers), on the test database."""
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url}
    env.pop("GUNICORN_CMD_ARGS", None)
    with GunicornServer(env, tmp_path / "gunicorn.log") as server:
        yield Served(server.host, server.port)


@pytest.fixture
def nginx(gunicorn: Served) -> Iterator[Served]:
    """nginx with deploy/nginx.conf, in front of ``gunicorn``."""
    binary = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if binary is None:
        pytest.skip("needs nginx (apt-get install nginx-light; .ci/run installs it)")
    port = free_port()
    site = NGINX_SITE.read_text()
    site = site.replace("server 127.0.0.1:8000;", f"server {gunicorn.host}:{gunicorn.port};")
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
        "events { worker_connections 256; }\n"
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
