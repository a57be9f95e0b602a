"""The dependency floors keep out the releases with known vulnerabilities in what they
parse from peers: a fresh install can resolve to none of them."""

from __future__ import annotations

import tomllib

import pytest
from packaging.requirements import Requirement

from tests.support.paths import REPO

# (package, the last vulnerable release, the advisory)
VULNERABLE = [
    ("djangorestframework", "3.15.1", "CVE-2024-21520"),
    ("h11", "0.15.0", "CVE-2025-43859"),
    ("idna", "3.6", "CVE-2024-3651"),
    ("cryptography", "42.0.3", "CVE-2024-26130"),
    ("aiohttp", "3.13.3", "the 3.13.4 security fixes"),
]


def floors() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    required = (Requirement(line) for line in project["dependencies"])
    return {r.name.lower(): r for r in required}


@pytest.mark.parametrize(("package", "release", "advisory"), VULNERABLE)
def test_no_vulnerable_release_is_admitted(package, release, advisory):
    requirement = floors().get(package)
    assert requirement is not None, f"{package} is not a direct dependency ({advisory})"
    assert not requirement.specifier.contains(release), (
        f"{package}{requirement.specifier} admits {release} ({advisory})"
    )
