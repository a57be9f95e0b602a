"""A run of scenarios: simulate each, check its invariants, measure it, and export it
as one JSON-ready dict (``--save`` writes it; the report and ``--compare`` read it)."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
from django.conf import settings
from django.db import DatabaseError, connection

from ..outbound.relay.database import interruption as interrupted_by
from . import invariants
from .inputs import BUILT_IN, Scenario
from .measures import measure
from .simulation import SAMPLES, Simulation

FORMAT = 1


def replay_command(scenario: Scenario, seed: int) -> str:
    """The command that runs this scenario again with this seed: a built-in one by name,
    a team's by its file."""
    built_in = not scenario.path or Path(scenario.path).parent == BUILT_IN
    target = scenario.name if built_in else scenario.path
    return f"python manage.py webhook_eval {shlex.quote(target)} --seed {seed}"


def evaluate(scenario: Scenario, *, seed: int, samples: int = SAMPLES) -> dict[str, Any]:
    """One scenario: its run, the counterfactual its isolation invariant needs, the
    verdicts and the figures. ``samples``: how often the backlog and the status's
    judgement are read over the run (each reading is the real status read)."""
    obs = Simulation(scenario, seed=seed, samples=samples).run()
    alone = None
    if scenario.isolated:
        alone = Simulation(scenario.only(scenario.isolated), seed=seed, samples=samples).run()
    verdicts = invariants.check(obs, alone)
    void = any(v.voids and not v.held for v in verdicts)
    return {
        "name": scenario.name,
        "description": scenario.description,
        "duration_s": scenario.duration,
        "seed": seed,
        "held": all(v.held for v in verdicts),
        "void": void,
        "verdicts": [
            {
                "name": v.name,
                "title": v.title,
                "held": v.held,
                "checked": v.checked,
                "first": v.first,
            }
            for v in verdicts
        ],
        "replay": replay_command(scenario, seed),
        "metrics": measure(obs),
        "destinations": [
            {
                "name": d.name,
                "rate": f"{d.rate_count}/{d.rate_seconds:g}s",
                "burst": d.burst,
                "max_in_flight": d.max_in_flight,
                "max_attempts": d.max_attempts,
            }
            for d in scenario.destinations
        ],
    }


def evaluate_all(
    scenarios: list[Scenario], *, seed: int, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    results = []
    for scenario in scenarios:
        if progress:
            progress(scenario.name)
        results.append(evaluate(scenario, seed=seed))
    return {
        "format": FORMAT,
        "code_version": code_version(),
        "database": connection.vendor,
        "seed": seed,
        "held": all(r["held"] for r in results),
        "scenarios": results,
    }


def code_version() -> str:
    """The package's version, and the commit when run from a git checkout."""
    try:
        version = metadata.version("django-webhook-inbox")
    except metadata.PackageNotFoundError:
        version = "unknown"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{version} ({commit})" if commit else version


class RunRefused(Exception):
    """The run cannot start, and why: one line a person can act on (exit status 3)."""


class Terminated(SystemExit):
    """SIGTERM during a run, raised so that the way out drops the run's database. A
    SystemExit (status 143, as the signal's own ending would give): no ``except
    Exception`` catches it on the way, and psycopg cancels the statement in flight, as it
    does for Ctrl-C."""


@contextmanager
def own_database(
    verbosity: int = 0, *, force: bool = False, say: Callable[[str], None] | None = None
) -> Iterator[str]:
    """A database of the run's own, made (and migrated) beside the configured one and
    dropped afterwards, as Django's test runner does: the host's rows are never read
    nor written. On PostgreSQL it is ``<NAME>_webhook_eval``; on SQLite, in memory.

    The name is checked before any statement: one the server would cut (PostgreSQL keeps
    the first 63 bytes of a name, so a long ``<NAME>`` cut back is the host's own) is
    refused. Only a database made by a run is ever dropped: if the name exists already,
    the run is refused (RunRefused); ``force`` drops it only when it carries the mark a
    run gives its database (one an earlier run, killed, left behind), never someone
    else's. The run's own is dropped on every way out: the end, an exception, Ctrl-C,
    and SIGTERM (turned into Terminated for the run's duration); ``say`` tells in one
    line when an interruption was cleaned up."""
    say = say or _to_stderr
    settings_dict = connection.settings_dict
    test = settings_dict.setdefault("TEST", {})
    if connection.vendor != "postgresql":
        # in memory: it ends with the process, and nothing else can hold its name
        test["NAME"] = None
        old_name = connection.creation.create_test_db(
            verbosity=max(0, verbosity - 1), autoclobber=True, serialize=False, keepdb=False
        )
        try:
            yield connection.settings_dict["NAME"]
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=max(0, verbosity - 1))
        return

    host = settings_dict["NAME"]
    name = _run_database_name(host)
    made = interrupted = False
    with _sigterm_raises():
        try:
            # made, and known to be made, at once: no interruption comes in between
            with _signals_held():
                _make_database(name, force=force)
                made = True
            if verbosity >= 2:
                say(f"webhook_eval: made its database {name}")
            test["NAME"] = name
            # keepdb: use the database just made (and migrate it) rather than make one
            connection.creation.create_test_db(
                verbosity=0, autoclobber=False, serialize=False, keepdb=True
            )
            yield name
        except BaseException as exc:
            interruption = interrupted_by(exc)
            if interruption is None:
                raise
            interrupted = True
            # a statement cut short may fail in turn on the way out (psycopg: "connection
            # in transaction status ACTIVE"): what happened is the interruption
            raise interruption from None
        finally:
            connection.close()
            settings.DATABASES[connection.alias]["NAME"] = settings_dict["NAME"] = host
            if made:
                # a second Ctrl-C or SIGTERM waits until the drop is done
                with _signals_held():
                    dropped = _drop_database(name, say)
                    if dropped and interrupted:
                        say(f"webhook_eval: interrupted; dropped its database {name}")
                    elif dropped and verbosity >= 2:
                        say(f"webhook_eval: dropped its database {name}")


RUN_DATABASE_SUFFIX = "_webhook_eval"
# The comment a run gives the database it makes: what --force may drop, and nothing else.
# (A constant without quotes: COMMENT takes a literal, not a parameter.)
RUN_DATABASE_MARK = "made by webhook_eval for one run, and dropped when the run ends"


def _run_database_name(host: str) -> str:
    """``<host>_webhook_eval``, if the server keeps it whole. PostgreSQL cuts a longer
    name to its limit (63 bytes in a default build) without a word, and the cut name
    can be the host's own database: every statement would then act on it."""
    name = f"{host}{RUN_DATABASE_SUFFIX}"
    try:
        with connection._nodb_cursor() as cursor:
            cursor.execute("SHOW max_identifier_length")
            limit = int(cursor.fetchone()[0])
    except DatabaseError as exc:
        raise RunRefused(f"cannot reach the database server: {exc}") from None
    size = len(name.encode())
    if size > limit:
        raise RunRefused(
            f"the run's database would be named {name}, {size} bytes, and PostgreSQL "
            f"keeps only the first {limit} bytes of a name: the name it would use is "
            f"{name.encode()[:limit].decode(errors='ignore')!r}, which may be another "
            f"database (the configured one's included). Give the configured database "
            f"(DATABASES NAME) a name of at most {limit - len(RUN_DATABASE_SUFFIX)} bytes "
            "to run webhook_eval beside it"
        )
    return name


def _make_database(name: str, *, force: bool) -> None:
    """CREATE DATABASE ``name`` and mark it as a run's; if it exists, refuse, or with
    ``force`` drop it first when it carries that mark. Anything the server answers
    instead (no such role, unreachable) is a RunRefused."""
    quoted = connection.ops.quote_name(name)
    create = f"CREATE DATABASE {quoted} {connection.creation.sql_table_creation_suffix()}"
    mark = f"COMMENT ON DATABASE {quoted} IS '{RUN_DATABASE_MARK}'"
    try:
        with connection._nodb_cursor() as cursor:
            try:
                cursor.execute(create.strip())
                cursor.execute(mark)
                return
            except DatabaseError as exc:
                if not isinstance(exc.__cause__, psycopg.errors.DuplicateDatabase):
                    raise
            cursor.execute(
                "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
                [name],
            )
            row = cursor.fetchone()
            left_by_a_run = row is not None and row[0] == RUN_DATABASE_MARK
            if not left_by_a_run:
                raise RunRefused(
                    f"the database {name} exists, and no run made it (a run makes its own "
                    "database under that name, marks it, and drops it afterwards): it is "
                    "left as it is, --force included. Look at what it holds; drop it "
                    f"yourself only if nothing in it matters (dropdb {name})"
                )
            if not force:
                raise RunRefused(
                    f"the database {name} exists, left behind by an earlier run that was "
                    "killed (it carries a run's mark): run again with --force to drop it "
                    "and make it afresh"
                )
            try:
                cursor.execute(f"DROP DATABASE {quoted}")
            except DatabaseError as exc:
                raise RunRefused(f"--force: cannot drop the database {name}: {exc}") from None
            cursor.execute(create.strip())
            cursor.execute(mark)
    except DatabaseError as exc:
        raise RunRefused(f"cannot make its database {name}: {exc}") from None


def _drop_database(name: str, say: Callable[[str], None]) -> bool:
    """Drop the run's own database (its sessions ended first, PostgreSQL 13 on: one
    interrupted mid-statement may linger); if that fails, say how to do it by hand."""
    quoted = connection.ops.quote_name(name)
    try:
        with connection._nodb_cursor() as cursor:
            force = " WITH (FORCE)" if cursor.connection.info.server_version >= 130000 else ""
            cursor.execute(f"DROP DATABASE IF EXISTS {quoted}{force}")
    except DatabaseError as exc:
        say(f"webhook_eval: could not drop its database {name} ({exc}): dropdb {name}")
        return False
    return True


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises Terminated for the block's duration (the previous handler back
    after), so that the run's ``finally`` runs; only the main thread receives signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum: int, frame: FrameType | None) -> None:
        raise Terminated(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM held back for the block (a statement that must not be cut in
    two: making or dropping the database), delivered when it ends."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "pthread_sigmask"
    ):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)
