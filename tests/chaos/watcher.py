"""The run's watcher: what ``/health/`` and ``manage.py webhook_status --json`` said,
every few seconds for the whole run, as a monitor would ask them, from outside.

Two threads, one per probe, each asking again ``every`` seconds after its last question
began (at once when the answer took longer). Each answer is a ``Probe``: when it was
asked and answered, whether it said OK (``True``), something is wrong (``False``), or did
not answer within its bound (``None``), what was wrong (``reasons``: short names, so
that ``truth.py`` can tell a new one from one said before the fault) and its words.

- ``/health/``: a GET with ``Accept: application/json`` and a 5 s timeout, as a load
  balancer's probe. 200 is OK; any other answer is "wrong", its reasons the failing
  checks (``Broker``, ``BeatHeartbeat``, ``Database``); a refused or reset connection
  too (a balancer takes the node out either way), reason ``connection``.
- ``webhook_status --json``: a process of its own, with ``STATUS_BOUND`` seconds to
  answer (Django's start, then its own STATUS_TIMEOUT_SECONDS bound). Its reasons are
  the ``code`` of each source's and destination's reasons (``destination:behind``), or
  ``unreadable`` for exit 3 (or any answer without its JSON). Two kinds are the run's
  own doing and left out: a source's ``rejected`` (the sender's tampered and stale
  requests, on purpose) and a disabled destination's (the noisy neighbours, disabled by
  the run as an operator would). "wrong" when any reason is left.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.support.paths import REPO

HEALTH = "health"
STATUS = "status"
HEALTH_EVERY = 2.0
STATUS_EVERY = 3.0  # a Django process each time: a second of CPU, about
HEALTH_BOUND = 5.0
STATUS_BOUND = 15.0
SAID_CHARS = 200


@dataclass
class Probe:
    kind: str  # HEALTH or STATUS
    start: float  # epoch seconds, asked
    end: float  # answered (or given up on)
    ok: bool | None  # None: no answer within the bound
    said: str
    reasons: tuple[str, ...] = ()  # what was wrong, when ok is False


class Watcher:
    """Probes ``/health/`` on ``host:port`` and ``webhook_status`` (run with ``env``)
    until stopped; each probe is kept and appended to ``out`` (JSON lines)."""

    def __init__(self, host: str, port: int, env: dict[str, str], out: Path) -> None:
        self.host, self.port, self.env, self.out = host, port, env, out
        self.probes: list[Probe] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(HEALTH, self.health, HEALTH_EVERY),
                             daemon=True),
            threading.Thread(target=self._loop, args=(STATUS, self.status, STATUS_EVERY),
                             daemon=True),
        ]  # fmt: skip

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> list[Probe]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=STATUS_BOUND + 5)
        with self._lock:
            return sorted(self.probes, key=lambda p: p.start)

    def _loop(self, kind: str, ask: Callable[[], tuple[tuple[str, ...] | None, str]],
              every: float) -> None:  # fmt: skip
        while not self._stop.is_set():
            start = time.time()
            reasons, said = ask()
            ok = None if reasons is None else not reasons
            probe = Probe(kind, start, time.time(), ok, said[:SAID_CHARS], reasons or ())
            with self._lock:
                self.probes.append(probe)
                with self.out.open("a") as out:
                    out.write(json.dumps(asdict(probe)) + "\n")
            self._stop.wait(max(0.0, every - (probe.end - start)))

    # each returns (reasons, words): reasons None when no answer came within the bound

    def health(self) -> tuple[tuple[str, ...] | None, str]:
        started = time.monotonic()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=HEALTH_BOUND)
        try:
            conn.request("GET", "/health/", headers={"Accept": "application/json"})
            response = conn.getresponse()
            body = response.read().decode(errors="replace")
        except TimeoutError:
            return None, f"no answer within {HEALTH_BOUND:g} s"
        except OSError as exc:  # refused, reset: the node is out either way
            return ("connection",), f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()
        if time.monotonic() - started > HEALTH_BOUND:  # answered, in pieces, too late
            return None, f"{response.status} after {time.monotonic() - started:.1f} s"
        if response.status == 200:
            return (), "200"
        failing = _failing(body)
        reasons = tuple(sorted(name.split("(")[0] for name in failing)) or (str(response.status),)
        return reasons, f"{response.status} " + "; ".join(f"{k}: {v}" for k, v in failing.items())

    def status(self) -> tuple[tuple[str, ...] | None, str]:
        command = [sys.executable, "manage.py", "webhook_status", "--json"]
        try:
            result = subprocess.run(
                command, cwd=REPO, env=self.env, capture_output=True, text=True,
                timeout=STATUS_BOUND,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return None, f"no answer within {STATUS_BOUND:g} s"
        try:
            document = json.loads(result.stdout)
            said = f"{document['state']}: {document['verdict']}"
            reasons = status_reasons(document)
        except (ValueError, KeyError, TypeError):  # exit 3, or a crash: its last words
            lines = (result.stderr or result.stdout).strip().splitlines()
            said = lines[-1] if lines else "(nothing said)"
            reasons = ("unreadable",)
        if result.returncode and not reasons:  # not OK, for reasons of the run's own doing
            said = f"(the run's own: ok) {said}"
        return reasons, f"exit {result.returncode} {said}"


def status_reasons(document: dict) -> tuple[str, ...]:
    """The reason codes of ``webhook_status --json`` (the sources', the destinations', the
    whole's, and the parts it could not read), but those of the run's own doing."""
    codes = {f"source:{r['code']}" for s in document["sources"] for r in s["reasons"]
             if r["code"] != "rejected"}  # fmt: skip
    codes |= {f"destination:{r['code']}" for d in document["destinations"] if d["enabled"]
              for r in d["reasons"]}  # fmt: skip
    # the whole's own (broker, beat) and each part the status could not read
    codes |= {f"status:{r['code']}" for r in document.get("reasons", [])}
    codes |= {f"unread:{u['what']}" for u in document.get("unread", [])}
    return tuple(sorted(codes))


def _failing(body: str) -> dict[str, str]:
    """The failing checks of django-health-check's JSON answer ({check: "OK" | error})."""
    try:
        results = json.loads(body)
        return {name: said for name, said in results.items() if said != "OK"}
    except (ValueError, AttributeError):
        return {"unreadable": body.strip()[:SAID_CHARS]}
