"""The repository's root, for the tests that start processes in it or read its files
(manage.py, deploy/, project/): computed here once, so that a test module can move
between directories without counting its parents."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
assert (REPO / "manage.py").is_file(), f"not the repository's root: {REPO}"
