"""A run of scenarios: simulate each, check its invariants, measure it, and export it
as one JSON-ready dict (``--save`` writes it; the report and ``--compare`` read it)."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

from django.db import connection

from . import invariants
from .measures import measure
from .scenario import BUILT_IN, Scenario
from .simulation import Simulation

FORMAT = 1


def replay_command(scenario: Scenario, seed: int) -> str:
    """The command that runs this scenario again with this seed: a built-in one by name,
    a team's by its file."""
    built_in = not scenario.path or Path(scenario.path).parent == BUILT_IN
    target = scenario.name if built_in else scenario.path
    return f"python manage.py webhook_eval {shlex.quote(target)} --seed {seed}"


def evaluate(scenario: Scenario, *, seed: int) -> dict[str, Any]:
    """One scenario: its run, the counterfactual its isolation invariant needs, the
    verdicts and the figures."""
    obs = Simulation(scenario, seed=seed).run()
    alone = None
    if scenario.isolated:
        alone = Simulation(scenario.only(scenario.isolated), seed=seed).run()
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


@contextmanager
def own_database(verbosity: int = 0) -> Iterator[str]:
    """A database of the run's own, made (and migrated) beside the configured one and
    dropped afterwards, as Django's test runner does: the host's rows are never read
    nor written. On PostgreSQL it is ``<NAME>_webhook_eval``; on SQLite, in memory."""
    settings_dict = connection.settings_dict
    test = settings_dict.setdefault("TEST", {})
    if connection.vendor == "postgresql":
        test["NAME"] = f"{settings_dict['NAME']}_webhook_eval"
    else:
        test["NAME"] = None  # in memory
    old_name = connection.creation.create_test_db(
        verbosity=max(0, verbosity - 1), autoclobber=True, serialize=False, keepdb=False
    )
    try:
        yield connection.settings_dict["NAME"]
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=max(0, verbosity - 1))
