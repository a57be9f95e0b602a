"""The embedded default (a SQLite file) when another writer holds the database, as a
migration or a VACUUM would: SQLite has one writer at a time and no lock timeout of its
own, only the connection's busy timeout (the demo's ``timeout``, 3 s). A delivery, its
capture and the 503's audit record each wait that long, and the sender gets a 503 within
a sender's 10 s: nothing is stored, the sender retries, and the retry applies it once
the writer is done.

It runs against the demo's own settings in a process of its own: the test database of
the suite's SQLite run lives in memory, where no other connection could hold it."""

from __future__ import annotations

import os
import sqlite3

from tests.settings import SHOP_SECRET
from tests.support.commands import manage

DELIVER = """
import io, time
from tests.support.signing import reserved, standard_headers
from webhook_receiver.exceptions import NotStored
from webhook_receiver.inbound.receive import webhook_receive
body = reserved("o_sqlite", ("S-Q", 1))
headers = standard_headers(body, msg_id="msg_sqlite")
started = time.monotonic()
try:
    outcome = webhook_receive(
        source_slug="shop", stream=io.BytesIO(body), content_length=len(body), headers=headers
    ).status
except NotStored:
    outcome = "not_stored"
print(outcome, round(time.monotonic() - started, 2))
"""


def run(env: dict[str, str], *args: str) -> str:
    done = manage(*args, env=env, timeout=120, check=True)
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def test_a_writer_holding_the_database_answers_503_within_a_senders_timeout(tmp_path):
    # given: the demo on its embedded default, migrated, in a folder of its own
    env = {**os.environ, "DEMO_VAR_DIR": str(tmp_path), "SHOP_WEBHOOK_SECRETS": SHOP_SECRET}
    env["DJANGO_SETTINGS_MODULE"] = "project.settings"
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "CACHE_URL"):
        env.pop(name, None)
    run(env, "migrate", "--noinput", "--verbosity", "0")

    # when: another connection holds the write lock while a delivery arrives
    holder = sqlite3.connect(tmp_path / "db.sqlite3", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        held = run(env, "shell", "-c", DELIVER)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    retried = run(env, "shell", "-c", DELIVER)

    # then: neither applied nor captured, after three busy timeouts of 3 s (the claim,
    # the capture, the 503's audit record), within a sender's 10 s; the retry applies it
    outcome, seconds = held.split()
    assert outcome == "not_stored"
    assert 8.5 <= float(seconds) < 10, seconds
    assert retried.split()[0] == "applied"
