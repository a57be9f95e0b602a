"""`manage.py check --deploy` on the demo project, in the production environment that
docs/deploying.md documents: nothing to report."""

from __future__ import annotations

import os
import subprocess

from tests.support.commands import manage

# docs/deploying.md, "The environment of a deployment"
PRODUCTION = {
    "DJANGO_SECRET_KEY": "a-production-key-of-fifty-characters-or-more-0123456789abcdef",
    "DJANGO_ALLOWED_HOSTS": "webhooks.example.com",
    "DJANGO_HTTPS": "true",
    "DJANGO_HSTS_SECONDS": "31536000",
    "DJANGO_HSTS_INCLUDE_SUBDOMAINS": "true",
    "DJANGO_HSTS_PRELOAD": "true",
    "DATABASE_URL": "postgres://app@db.internal:5432/webhooks",
    "CELERY_BROKER_URL": "redis://redis.internal:6379/0",
    "CACHE_URL": "redis://redis.internal:6379/1",
    "SHOP_WEBHOOK_SECRETS": "whsec_YmVuY2gtb25seS1zZWNyZXQtMjQtYnl0ZXM=",
    "WEBHOOK_SECRET_ENCRYPTION_KEYS": "mZ1g2dDqXmNaeqvnkZ3fh_J4ivXq9RZJPRnNvFyAFqs=",
    "WEBHOOK_TRUSTED_PROXIES": "1",
}


def check_deploy(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # nothing of this machine's environment: only what a deployment sets (a .env beside
    # manage.py fills gaps only, and sets none of these)
    env = {"PATH": os.environ["PATH"], **environment}
    return manage("check", "--deploy", "--fail-level", "WARNING", env=env, timeout=120)


def test_the_documented_production_environment_passes_check_deploy():
    done = check_deploy(PRODUCTION)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "no issues" in done.stdout


def test_without_https_check_deploy_says_what_is_missing():
    done = check_deploy({k: v for k, v in PRODUCTION.items() if not k.startswith("DJANGO_H")})
    assert done.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in done.stderr
