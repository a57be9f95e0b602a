# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000
PG_TEST_URL ?= postgres://postgres@127.0.0.1:5432/webhook_receiver

.PHONY: install run test test-postgres test-sqlite bench lint

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[server,test,dev]"
	touch $@

install: $(VENV)/.installed

# A fresh .env with random secrets; never overwrites an existing one.
.env:
	@$(BIN)/python -c "import base64, secrets, pathlib; \
	text = pathlib.Path('.env.example').read_text(); \
	text = text.replace('DJANGO_SECRET_KEY=change-me', 'DJANGO_SECRET_KEY=' + secrets.token_urlsafe(50)); \
	text = text.replace('whsec_change-me', 'whsec_' + base64.b64encode(secrets.token_bytes(24)).decode()); \
	pathlib.Path('.env').write_text(text)"
	@echo "wrote .env with fresh secrets"

run: install .env
	@mkdir -p var/broker var/broker-control
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py collectstatic --noinput --verbosity 0
	@echo
	@echo "  Endpoint:   POST http://$(HOST):$(PORT)/webhooks/shop/"
	@echo "  Admin:      http://$(HOST):$(PORT)/admin/  (create a user: $(BIN)/python manage.py createsuperuser)"
	@echo "  Send a signed test event (in another terminal):"
	@echo "      $(BIN)/python manage.py send_test_webhook"
	@echo "  or print it as a curl command:"
	@echo "      $(BIN)/python manage.py send_test_webhook --print-curl"
	@echo
	@trap 'kill 0' INT TERM EXIT; \
	$(BIN)/celery -A project worker --loglevel INFO --concurrency 2 & \
	$(BIN)/celery -A project beat --loglevel INFO & \
	$(BIN)/gunicorn project.wsgi --bind $(HOST):$(PORT) --workers 2 --access-logfile - & \
	wait

test: test-postgres test-sqlite

test-postgres: install
	DATABASE_URL=$(PG_TEST_URL) $(BIN)/pytest

test-sqlite: install
	DATABASE_URL=sqlite:///$(CURDIR)/var/test.sqlite3 $(BIN)/pytest

bench: install
	$(BIN)/python -m tests.bench.run

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
