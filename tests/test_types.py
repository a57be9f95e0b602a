"""The app's types: mypy over webhook_receiver/ as `make lint` runs it ([tool.mypy] in
pyproject.toml), so that the README's test command checks them too (docs/testing.md)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None
    or importlib.util.find_spec("mypy_django_plugin") is None,
    reason="needs mypy and django-stubs (the dev extra: pip install -e '.[dev]')",
)
def test_mypy_finds_no_error_in_the_app():
    # the cache under .mypy_cache/ (ignored by git) keeps a second run to seconds; the
    # plugin loads tests.settings, which need neither a database nor a .env
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-color-output"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
