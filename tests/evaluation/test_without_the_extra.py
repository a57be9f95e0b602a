"""The harness is an extra (``pip install "django-webhook-inbox[eval]"``): a host that
installs the app alone carries none of its dependencies, and the app (its modules, the
system checks, its commands) runs without them; ``webhook_eval`` says in one line how to
install them, never a traceback."""

from __future__ import annotations

import json
import os
import textwrap
import tomllib

import pytest
from packaging.requirements import Requirement

from tests.settings import SHOP_SECRET
from tests.support.commands import python
from tests.support.paths import REPO
from webhook_receiver.management.commands.webhook_eval import DISTRIBUTION, HARNESS_NEEDS

# a process's first lines: the harness's dependencies made unimportable, as when the
# extra is not installed (None in sys.modules: "import of … halted")
WITHOUT = "import sys\nfor name in {names!r}:\n    sys.modules[name] = None\n"


@pytest.fixture
def env() -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": "sqlite:///:memory:",
        "SHOP_WEBHOOK_SECRETS": SHOP_SECRET,
    }


def test_the_harness_dependencies_are_the_eval_extra_and_not_the_apps():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = {Requirement(line).name.lower() for line in project["dependencies"]}
    extra = {Requirement(line).name.lower() for line in project["optional-dependencies"]["eval"]}

    assert project["name"] == DISTRIBUTION
    assert extra == {"time-machine", "pyyaml", "pydantic"} and not extra & runtime


@pytest.mark.parametrize("missing", ["time_machine", "yaml", "pydantic"])
def test_webhook_eval_without_the_extra_says_how_to_install_it(env, missing):
    code = WITHOUT.format(names=[missing]) + textwrap.dedent(
        """
        import runpy
        sys.argv = ["manage.py", "webhook_eval", "tiny"]
        runpy.run_path("manage.py", run_name="__main__")
        """
    )

    done = python("-c", code, env=env, timeout=120)

    assert done.returncode == 3, done.stderr
    assert done.stderr.strip() == (
        "CommandError: webhook_eval needs the evaluation harness's dependencies "
        f'({missing} is not installed): pip install "django-webhook-inbox[eval]"'
    )


def test_the_app_imports_sets_up_and_checks_without_the_harness_dependencies(env):
    code = WITHOUT.format(names=sorted(HARNESS_NEEDS)) + textwrap.dedent(
        """
        import importlib, json, pkgutil
        import django
        from django.core.management import call_command

        django.setup()
        import webhook_receiver

        imported = []
        for module in pkgutil.walk_packages(webhook_receiver.__path__, "webhook_receiver."):
            if module.name.startswith("webhook_receiver.evaluation"):
                continue
            importlib.import_module(module.name)
            imported.append(module.name)
        call_command("check")
        print(json.dumps(imported))
        """
    )

    done = python("-c", code, env=env, timeout=120)

    assert done.returncode == 0, done.stderr[-3000:]
    assert "System check identified no issues" in done.stdout
    imported = json.loads(done.stdout.splitlines()[-1])
    # every room: the models, the admin, the relay, the commands (webhook_eval's too)
    assert {
        "webhook_receiver.models",
        "webhook_receiver.admin",
        "webhook_receiver.outbound.relay.engine",
        "webhook_receiver.management.commands.webhook_eval",
    } <= set(imported)
    assert len(imported) > 150
