"""Run the demo for development: gunicorn, the outbox relay, a Celery worker and Celery
beat, together.

    python -m project.devserver [--host 127.0.0.1] [--port 8000]

(`make run` runs this.) Ctrl-C, or SIGTERM to this process, stops all four: each is
sent one SIGTERM, and whatever still runs after STOP_SECONDS is killed with its
process group. The four run in sessions of their own, so that the terminal's Ctrl-C
reaches this process alone and each of them is told exactly once.

gunicorn is served directly, which suits development only: in production put nginx in
front of it (deploy/nginx.conf, docs/deploying.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

STOP_SECONDS = 10
BASE_DIR = Path(__file__).resolve().parent.parent
GUNICORN_CONFIG = BASE_DIR / "deploy" / "gunicorn.conf.py"
# Where it serves, for send_test_webhook to find whatever the port (removed on stop)
ADDRESS_FILE = "devserver-address"


def address_file() -> Path:
    """The file under the demo's var/ (DEMO_VAR_DIR, as project/settings.py reads it)."""
    return Path(os.environ.get("DEMO_VAR_DIR") or BASE_DIR / "var") / ADDRESS_FILE


def commands(host: str, port: int) -> dict[str, list[str]]:
    bin_dir = Path(sys.executable).parent
    return {
        # the deployment's gunicorn settings (the command line's win): with them its
        # metrics set-up, so that /metrics/ counts the requests of both workers
        "web": [
            str(bin_dir / "gunicorn"),
            "project.wsgi",
            "--config",
            str(GUNICORN_CONFIG),
            "--bind",
            f"{host}:{port}",
            "--workers",
            "2",
            "--access-logfile",
            "-",
        ],
        "relay": [sys.executable, str(BASE_DIR / "manage.py"), "webhook_relay"],
        "worker": [
            str(bin_dir / "celery"),
            "-A",
            "project",
            "worker",
            "--loglevel",
            "INFO",
            "--concurrency",
            "2",
        ],
        "beat": [str(bin_dir / "celery"), "-A", "project", "beat", "--loglevel", "INFO"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    args = parser.parse_args(argv)

    stop_requested: list[int] = []

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop_requested.append(signum)

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)

    # One metrics directory for web, relay and worker (one host): /metrics/ then shows
    # the relay's deliveries beside the requests. gunicorn empties it as it starts.
    metrics_dir = None
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        metrics_dir = tempfile.mkdtemp(prefix="webhook-receiver-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    allow_loopback_merchants()
    children = {
        name: subprocess.Popen(command, start_new_session=True)
        for name, command in commands(args.host, args.port).items()
    }
    address = address_file()
    address.parent.mkdir(parents=True, exist_ok=True)
    address.write_text(f"http://{reachable(args.host)}:{args.port}\n")
    # Until a stop is asked for, or one of them ends by itself.
    while not stop_requested and all(child.poll() is None for child in children.values()):
        time.sleep(0.2)
    ended = [name for name, child in children.items() if child.poll() is not None]
    if ended and not stop_requested:
        say(f"\n{' and '.join(ended)} stopped unexpectedly; stopping the rest.")
    else:
        say("\nStopping web, relay, worker and beat…")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C changes nothing
    stopped = stop(children)
    address.unlink(missing_ok=True)
    if metrics_dir:
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return stopped


LOOPBACK_NETWORKS = "127.0.0.0/8,::1/128"


def allow_loopback_merchants() -> None:
    """On a development machine the merchants are local: the egress guard lets the relay
    reach loopback, unless the environment or .env says otherwise, and says so."""
    env_file = BASE_DIR / ".env"
    named = env_file.exists() and any(
        line.startswith("WEBHOOK_EGRESS_ALLOWED_NETWORKS=")
        for line in env_file.read_text().splitlines()
    )
    if "WEBHOOK_EGRESS_ALLOWED_NETWORKS" in os.environ or named:
        return
    os.environ["WEBHOOK_EGRESS_ALLOWED_NETWORKS"] = LOOPBACK_NETWORKS
    say(
        f"  Egress: destinations on loopback ({LOOPBACK_NETWORKS}) are allowed, for local "
        "merchants; other internal addresses are refused."
    )


def reachable(host: str) -> str:
    """The address a client on this machine uses: loopback for a server listening on
    every address, brackets around an IPv6 one."""
    if host in ("0.0.0.0", "", "::", "[::]"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def say(text: str) -> None:
    """Print, unless the output is gone (`make run | tee log` loses tee to the same
    Ctrl-C): the children must be stopped whether or not anyone reads about it."""
    with contextlib.suppress(OSError):
        print(text, flush=True)


def stop(children: dict[str, subprocess.Popen[bytes]]) -> int:
    for child in children.values():
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + STOP_SECONDS
    for name, child in children.items():
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            say(f"{name} did not stop in {STOP_SECONDS} s: killed.")
        # the group: a Celery pool's processes, gunicorn's workers
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    say("Stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
