# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Where `make run` serves: the command line (make run PORT=8150), else the environment,
# else HOST= and PORT= lines in .env, else these. While it runs, it writes the address to
# var/devserver-address, where send_test_webhook finds it.
HOST ?= $(or $(shell sed -n 's/^HOST=//p' .env 2>/dev/null | tail -n 1),127.0.0.1)
PORT ?= $(or $(shell sed -n 's/^PORT=//p' .env 2>/dev/null | tail -n 1),8000)
PG_TEST_URL ?= postgres://postgres@127.0.0.1:5432/webhook_receiver
# The test database pytest creates and drops; give each concurrent run its own name.
TEST_DATABASE_NAME ?= test_webhook_receiver

.PHONY: install run test test-postgres test-sqlite eval eval-baseline bench bench-reconcile bench-metrics bench-relay bench-recovery bench-retention bench-sources lint docs

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[server,test,dev,eval]"
	touch $@

install: $(VENV)/.installed

# A fresh .env with random secrets (the Django key, the shop's signing secret, the key
# that encrypts destinations' secrets: a Fernet key is 32 random bytes in url-safe
# base64; the demo merchant's signing secret); never overwrites an existing one.
.env:
	@$(BIN)/python -c "import base64, secrets, pathlib; \
	text = pathlib.Path('.env.example').read_text(); \
	text = text.replace('DJANGO_SECRET_KEY=change-me', 'DJANGO_SECRET_KEY=' + secrets.token_urlsafe(50)); \
	text = text.replace('whsec_change-me', 'whsec_' + base64.b64encode(secrets.token_bytes(24)).decode()); \
	text = text.replace('fernet-change-me', base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()); \
	text = text.replace('demo-merchant-change-me', 'whsec_' + base64.b64encode(secrets.token_bytes(32)).decode()); \
	pathlib.Path('.env').write_text(text)"
	@echo "wrote .env with fresh secrets"

run: install .env
	@mkdir -p var/broker var/broker-control
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py collectstatic --noinput --verbosity 0
	$(BIN)/python manage.py demo_setup --host $(HOST) --port $(PORT)
	@echo
	@echo "  Endpoint:  POST http://$(HOST):$(PORT)/webhooks/shop/"
	@echo "  Admin:     http://$(HOST):$(PORT)/admin/"
	@echo "  Demo merchant: http://$(HOST):$(PORT)/demo-merchant/ receives the shop's webhooks"
	@echo "  In another terminal, create an admin user:"
	@echo "      $(BIN)/python manage.py createsuperuser"
	@echo "  and send a signed test event (it finds this server; --print-curl for a curl command):"
	@echo "      $(BIN)/python manage.py send_test_webhook"
	@echo "  An order event goes on to the demo merchant; its portal opens with a one-use link:"
	@echo "      $(BIN)/python manage.py send_test_webhook --type order.paid"
	@echo "      $(BIN)/python manage.py webhook_portal_link demo --capability recover"
	@echo "  Stop with Ctrl-C. This serves gunicorn directly, for development only."
	@echo
	@HOST=$(HOST) PORT=$(PORT) $(BIN)/python -m project.devserver --host $(HOST) --port $(PORT)

# The suite on PostgreSQL, then on SQLite the tests the engine can change, each spread
# over TEST_PROCESSES processes (pytest-xdist; a file's tests stay in one; three beat two
# on two cores, as many tests wait on processes and sockets). Each process
# has its own test database and its own Redis database, counted down from the one
# CELERY_BROKER_URL names (tests/settings.py).
TEST_PROCESSES ?= 3
PYTEST_SPREAD = -n $(TEST_PROCESSES) --dist loadfile

test: test-postgres test-sqlite

test-postgres: install
	DATABASE_URL=$(PG_TEST_URL) TEST_DATABASE_NAME=$(TEST_DATABASE_NAME) $(BIN)/pytest $(PYTEST_SPREAD)

test-sqlite: install
	DATABASE_URL=sqlite:///$(CURDIR)/var/test.sqlite3 $(BIN)/pytest $(PYTEST_SPREAD)

# The evaluation harness: the built-in scenarios in simulated time (a database of their
# own), the report on the terminal and in var/eval/report.html, compared with the
# baseline kept in deploy/eval/ (exit 1: an invariant broke; 2: a regression). On
# PostgreSQL unless DATABASE_URL says otherwise.
EVAL_DATABASE_URL ?= $(PG_TEST_URL)
eval: install .env
	DATABASE_URL=$(EVAL_DATABASE_URL) $(BIN)/python manage.py webhook_eval \
		--html var/eval/report.html --save var/eval/run.json --compare deploy/eval/baseline.json

# After a deliberate change of policy: run again and keep the run as the new baseline
eval-baseline: install .env
	DATABASE_URL=$(EVAL_DATABASE_URL) $(BIN)/python manage.py webhook_eval \
		--save deploy/eval/baseline.json --html var/eval/report.html

bench: install
	$(BIN)/python -m tests.bench.run

# Reconciliation: 100,000 sender events against 1,000,000 receipts (about a minute)
bench-reconcile: install
	$(BIN)/python -m tests.bench.reconcile

# A /metrics/ scrape against 1,000,000 receipts and 100,000 failed events (about a minute)
bench-metrics: install
	$(BIN)/python -m tests.bench.metrics

# Retention: each purge job on 1,000,000-row tables, and the claim's latency while it runs
bench-retention: install
	$(BIN)/python -m tests.bench.retention

# The outbox relay: one merchant against an aiohttp floor, the limiter and the latency on
# a relay process, then 10 to 1,000 merchants on one relay process against a floor
# process, and black holes beside 300 (about 5 minutes; docs/benchmarks.md#relay)
bench-relay: install
	$(BIN)/python -m tests.bench.relay

# A recovery job of 50,000 failed messages at 200/s beside live traffic at 50/s, its relay
# SIGKILLed halfway and another started: plan = run, lease-only duplicates (about 5 minutes)
bench-recovery: install
	$(BIN)/python -m tests.bench.recovery

# A source kept as a record against one of the settings, requests a second to each
bench-sources: install
	$(BIN)/python -m tests.bench.sources

# docs/configuration.md's tables of keys, written from their declarations in
# webhook_receiver/conf/ (tests/test_configuration_docs.py fails while they differ)
docs: install
	$(BIN)/python -m webhook_receiver.conf.docs

# ruff, then mypy over webhook_receiver/ ([tool.mypy] in pyproject.toml; docs/testing.md)
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The fault run before a deploy (docs/testing.md#the-fault-run-make-chaos): gunicorn, a
# Celery worker and beat, a PostgreSQL and a Redis of its own, SIGKILLs, a database stop,
# locks, merchants that never answer beside the run's; every effect checked.
# The long run (10,000 events, about 9 minutes) writes var/chaos/report.txt and .json.
# PLANT=double-effect (or delivered-without-effect, out-of-order, lost-message) plants that
# defect in the served processes, to watch the run fail. TRUTHFUL=1 makes the check of what
# /health/ and webhook_status said through the faults fail the run (else report-only).
.PHONY: chaos chaos-short
CHAOS_TRUTHFUL = $(if $(TRUTHFUL),--require-truthful-status)
chaos: install
	$(BIN)/python -m tests.chaos $(if $(PLANT),--plant $(PLANT)) $(CHAOS_TRUTHFUL)

# The same in about 3.5 minutes (fewer events, shorter holds), for CI
chaos-short: install
	$(BIN)/python -m tests.chaos --short $(if $(PLANT),--plant $(PLANT)) $(CHAOS_TRUTHFUL)
