"""The repository's own commands run as a team runs them: a process of its own, this
Python, in the repository's root (tests/support/paths.py), its output kept as text."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping

from tests.support.paths import REPO


def python(
    *args: str, env: Mapping[str, str], timeout: float | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """``python *args`` in the repository's root, in ``env``; its exit status, stdout and
    stderr (``check``: CalledProcessError on a failure; ``timeout``: TimeoutExpired)."""
    argv = [sys.executable, *args]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        done.check_returncode()
    return done


def manage(
    *args: str, env: Mapping[str, str], timeout: float | None = None, check: bool = False
) -> subprocess.CompletedProcess[str]:
    """``python manage.py *args``, as ``python`` runs it."""
    return python("manage.py", *args, env=env, timeout=timeout, check=check)
