"""The package as a host installs it: the sdist and wheel built (`python -m build`) and
checked (`twine check`); the built wheel, not the checkout, installed into a fresh
virtualenv beside a minimal host project written here, which runs `check`, `migrate`
and one signed request. The wheel holds the app's templates, migrations, scenarios,
`py.typed` and LICENSE, and nothing of the demo project or the tests."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import REPO

SECRET = "whsec_" + base64.b64encode(b"wheel-test-secret-24-byte").decode()
INSTALL_SECONDS = 600

HOST_SETTINGS = f"""
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "wheel-test-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "health_check",
    "webhook_receiver",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "host.urls"
TEMPLATES = [{{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {{"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]}},
}}]
DATABASES = {{
    "default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"}},
}}
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "static"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
CELERY_BROKER_URL = "memory://"
WEBHOOK_RECEIVER = {{"SOURCES": {{"orders": {{"SCHEME": "standard", "SECRETS": ["{SECRET}"]}}}}}}
"""

HOST_URLS = """
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("webhooks/", include("webhook_receiver.urls")),
]
"""

# One signed request through the test client, signed as the Standard Webhooks
# specification spells it out, and what it left behind.
HOST_REQUEST = """
import base64, hashlib, hmac, json, sys, time
import django
django.setup()
from django.test import Client
from webhook_receiver.models import RequestAudit, WebhookReceipt

secret = sys.argv[1]
body = json.dumps({"type": "order.created", "data": {"id": "ord_1"}}).encode()
stamp = str(int(time.time()))
key = base64.b64decode(secret.removeprefix("whsec_"))
mac = hmac.new(key, b"msg_wheel_1." + stamp.encode() + b"." + body, hashlib.sha256).digest()
answer = Client().post(
    "/webhooks/orders/", data=body, content_type="application/json",
    HTTP_WEBHOOK_ID="msg_wheel_1", HTTP_WEBHOOK_TIMESTAMP=stamp,
    HTTP_WEBHOOK_SIGNATURE="v1," + base64.b64encode(mac).decode(),
)
print(answer.status_code, answer.json()["status"], WebhookReceipt.objects.count(),
      RequestAudit.objects.count())
"""


def run(*command: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=INSTALL_SECONDS,
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    for module in ("build", "twine"):
        try:
            __import__(module)
        except ImportError:
            pytest.skip(f"needs {module} (pip install -e '.[dev]')")
    out = tmp_path_factory.mktemp("dist")
    # the wheel built from the sdist, as build does by default: built from the checkout,
    # setuptools reuses its build/ folder, and a module deleted since stays in the wheel
    run(sys.executable, "-m", "build", "--outdir", out, REPO, cwd=REPO)
    files = {path.suffix: path for path in out.iterdir()}
    run(sys.executable, "-m", "twine", "check", "--strict", *files.values(), cwd=out)
    return {"wheel": files[".whl"], "sdist": files[".gz"]}


def test_the_wheel_holds_the_app_and_nothing_of_the_demo_or_the_tests(built):
    names = zipfile.ZipFile(built["wheel"]).namelist()
    top = {name.split("/", 1)[0] for name in names}
    assert {name for name in top if not name.endswith(".dist-info")} == {"webhook_receiver"}
    assert "webhook_receiver/py.typed" in names
    assert any(n.startswith("webhook_receiver/migrations/0001_") for n in names)
    assert any(n.startswith("webhook_receiver/templates/admin/") for n in names)
    assert any(n.startswith("webhook_receiver/evaluation/scenarios/") for n in names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(built["wheel"]).read(metadata).decode()
    assert "License-Expression: MIT" in text


def test_a_host_project_runs_the_built_wheel_check_migrate_and_a_signed_request(built, tmp_path):
    # given: a fresh virtualenv with the built wheel (and its dependencies) installed
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "--quiet", built["wheel"], cwd=tmp_path)
    # and: a minimal host project beside it, nowhere near the checkout
    host = tmp_path / "site"
    (host / "host").mkdir(parents=True)
    (host / "host" / "__init__.py").write_text("")
    (host / "host" / "settings.py").write_text(HOST_SETTINGS)
    (host / "host" / "urls.py").write_text(HOST_URLS)
    (host / "request.py").write_text(textwrap.dedent(HOST_REQUEST))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "host.settings",
        "PYTHONPATH": str(host),
    }

    # when
    installed = run(python, "-c", "import webhook_receiver; print(webhook_receiver.__file__)",
                    cwd=host, env=env)  # fmt: skip
    checked = run(python, "-m", "django", "check", cwd=host, env=env)
    run(python, "-m", "django", "migrate", "--noinput", cwd=host, env=env)
    answered = run(python, "request.py", SECRET, cwd=host, env=env)

    # then: the app came from the virtualenv, and answered as documented
    assert str(venv) in installed and str(REPO) not in installed
    assert "no issues" in checked
    assert answered.split() == ["200", "ignored", "1", "1"]
