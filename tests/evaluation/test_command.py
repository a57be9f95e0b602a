"""manage.py webhook_eval as a team runs it: a process of its own, on the configured
database, in a database of its own that it makes and drops; its exit status says
whether every invariant held and whether anything regressed against a saved run."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from django.db import connection

from tests.settings import SHOP_SECRET
from tests.support.commands import manage
from webhook_receiver.evaluation.invariants import NAMES

pytestmark = pytest.mark.both_engines("the run's own database is on the suite's engine")

TINY = "tests/evaluation/data/tiny.yaml"


@pytest.fixture
def eval_command(tmp_path):
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        # its own database is made beside this name and dropped after
        url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}_cmd"
    else:
        url = f"sqlite:///{tmp_path / 'host.sqlite3'}"
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "SHOP_WEBHOOK_SECRETS": SHOP_SECRET,
    }
    env.pop("CELERY_BROKER_URL", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return manage("webhook_eval", *args, env=env, timeout=300)

    return run


def test_a_run_prints_its_report_and_saves_it_and_its_page(eval_command, tmp_path):
    saved, page = tmp_path / "run.json", tmp_path / "report.html"

    done = eval_command(TINY, "--seed", "5", "--save", str(saved), "--html", str(page))

    assert done.returncode == 0, done.stderr
    held = f"{len(NAMES)} of {len(NAMES)} invariants held"
    assert "  PASS  tiny " in done.stdout and held in done.stdout
    # this machine's figures: the relay's statements, and the idle sweep's
    assert re.search(
        r"tiny +[\d.]+ statements a delivery, [\d.]+ an admission, "
        r"[\d,.]+ sweep statements an hour;",
        done.stdout,
    ), done.stdout[-600:]
    export = json.loads(saved.read_text())
    assert export["format"] == 1 and export["seed"] == 5 and export["held"]
    assert export["scenarios"][0]["metrics"]["destinations"]["shop"]["delivered"] == 10
    assert page.read_text().startswith("<!DOCTYPE html>")
    # the host's database was never touched: nothing was even created in it
    if connection.vendor == "sqlite":
        assert (
            not (tmp_path / "host.sqlite3").exists()
            or not (tmp_path / "host.sqlite3").stat().st_size
        )


def test_compare_exits_2_on_a_regression_and_names_it(eval_command, tmp_path):
    saved = tmp_path / "run.json"
    assert eval_command(TINY, "--save", str(saved)).returncode == 0
    export = json.loads(saved.read_text())
    shop = export["scenarios"][0]["metrics"]["destinations"]["shop"]
    # a baseline better than this run: its p95 latency was a tenth, and nothing retried
    shop["latency_p95_s"] = round((shop["latency_p95_s"] or 10) / 10, 3)
    shop["attempts_per_delivered"] = 1.0
    saved.write_text(json.dumps(export))

    done = eval_command(TINY, "--compare", str(saved))

    assert done.returncode == 2, done.stdout + done.stderr
    assert "REGRESSION tiny/shop: latency_p95_s" in done.stdout
    assert "REGRESSION tiny/shop: attempts_per_delivered" in done.stdout


def test_a_scenario_that_cannot_run_exits_3_with_the_reason(eval_command, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nduration: soon\nadmissions: [{orders: 1}]\n")

    done = eval_command(str(bad))

    assert done.returncode == 3
    assert "bad.yaml: duration: 'soon' is not a duration" in done.stderr


def test_list_names_the_built_in_scenarios(eval_command):
    done = eval_command("--list")

    assert done.returncode == 0
    assert "flash-sale" in done.stdout and "A flash sale" in done.stdout
