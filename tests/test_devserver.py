"""`make run`'s launcher (project/devserver.py): it starts web, worker and beat, and a
Ctrl-C or SIGTERM stops every process it started, quickly and quietly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from tests.bench.server import free_port
from tests.settings import SHOP_SECRET
from tests.support.commands import manage
from tests.support.paths import REPO
from tests.support.served import listening, wait_listening


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_stopping_ends_every_process_quickly_and_quietly(tmp_path, how):
    # given: the launcher running, on its own port and files, as `make run` starts it
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DEMO_VAR_DIR": str(tmp_path / "var"),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "CELERY_BROKER_URL": "filesystem://",
        "SHOP_WEBHOOK_SECRETS": SHOP_SECRET,
        # what `make run` writes into .env: the key that encrypts destinations' secrets
        "WEBHOOK_SECRET_ENCRYPTION_KEYS": Fernet.generate_key().decode(),
    }
    subprocess.run(  # as `make run` does first
        [sys.executable, "manage.py", "migrate", "--noinput", "--verbosity", "0"],
        cwd=REPO, env=env, check=True, timeout=120,
    )  # fmt: skip
    launcher = subprocess.Popen(
        [sys.executable, "-m", "project.devserver", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a terminal's foreground group, of which it is the leader
    )
    try:
        wait_listening(port, seconds=30)
        time.sleep(3)  # the worker and beat are up too
        started = descendants(launcher.pid)
        assert len(started) >= 6  # 4 programs, gunicorn's 2 workers, the worker's pool
        # and: the README's plain send_test_webhook finds it, whatever its port
        address = tmp_path / "var" / "devserver-address"
        assert address.read_text().strip() == f"http://127.0.0.1:{port}"
        sent = manage("send_test_webhook", env=env, timeout=60)
        assert sent.returncode == 0 and '"status":"applied"' in sent.stdout.replace(" ", ""), (
            sent.stdout + sent.stderr
        )
        # and: the relay sends the outbox on the embedded default (SQLite, no server): an
        # order event forwarded to a destination on the demo's own endpoint, as
        # docs/sending.md shows, is delivered within its poll
        added = manage(
            "webhook_destination", "add", "self",
            "--url", f"http://127.0.0.1:{port}/webhooks/shop/",
            "--secret", SHOP_SECRET, "--events", "order.paid", "--rate", "5/s",
            env=env, timeout=60,
        )  # fmt: skip
        assert added.returncode == 0, added.stdout + added.stderr
        paid = manage(
            "send_test_webhook", "--type", "order.paid", "--order-id", "ord_demo",
            "--order-version", "3", "--event-id", "evt_demo", env=env, timeout=60,
        )  # fmt: skip
        assert paid.returncode == 0, paid.stdout + paid.stderr
        deadline = time.monotonic() + 20
        while True:
            trace = manage("webhook_trace", "evt_demo", env=env, timeout=60)
            if "delivered" in trace.stdout or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert "to self" in trace.stdout and "delivered" in trace.stdout, trace.stdout

        # when: Ctrl-C in the terminal (SIGINT to the whole foreground group), or SIGTERM
        stopped_at = time.monotonic()
        if how == "ctrl-c":
            os.killpg(launcher.pid, signal.SIGINT)
        else:
            launcher.send_signal(signal.SIGTERM)
        output, _ = launcher.communicate(timeout=30)
        took = time.monotonic() - stopped_at
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)

    # then: everything it started has ended, within seconds, and nothing holds the port
    text = output.decode(errors="replace")
    assert launcher.returncode == 0, text[-2000:]
    assert took < 12
    assert [pid for pid in started if alive(pid)] == []
    assert not listening(port)
    assert not (tmp_path / "var" / "devserver-address").exists()
    # and the terminal shows a short, calm shutdown
    shutdown = text[text.index("Stopping web, relay, worker and beat") :]
    assert len(shutdown.splitlines()) < 25, shutdown
    assert shutdown.rstrip().endswith("Stopped.")
    for alarm in ("Segmentation fault", "Traceback", "killed"):
        assert alarm not in shutdown
