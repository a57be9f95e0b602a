"""The orchestrator of ``python -m tests.chaos``: starts the run's servers and
processes, sends the plan while the faults run, drains, checks, reports, and stops
everything it started, whatever ended the run (an error, Ctrl-C, SIGTERM).

Exit status: 0 when every check held; 1 when one failed (a loss, a double effect, a
mismatch); 2 when the run itself could not be carried out. ``--plant NAME`` plants a
defect in the served processes (``plants.py``): such a run fails, and its report says
whether the check that guards against that defect was the one that caught it.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from tests.bench.server import git_commit, raise_on_sigterm
from tests.chaos import checks, report
from tests.chaos.faults import BROKER, LONG, SHORT, Faults
from tests.chaos.merchant import DESTINATION as MERCHANT
from tests.chaos.merchant import EVENTS as MERCHANT_EVENTS
from tests.chaos.merchant import Merchant
from tests.chaos.plan import plan_build, plan_save
from tests.chaos.plants import ENV as PLANT_ENV
from tests.chaos.plants import PLANTS
from tests.chaos.processes import CeleryBeat, CeleryWorker, Gunicorn, RelayProcess, Service
from tests.chaos.truth import truth_check, truth_table
from tests.chaos.watcher import Watcher
from tests.support.paths import REPO
from tests.support.private_servers import PrivatePostgres, PrivateRedis

GUNICORN_WORKERS = 3
# the health probes' own gunicorn (docs/deploying.md): two, so a slow answer does not
# queue the next probe
PROBE_WORKERS = 2
DRAIN_SECONDS = {"short": 75, "long": 240}


class Stack:
    """Everything a run starts, and how to stop it."""

    def __init__(self, run_dir: Path, log, plant: str | None = None) -> None:
        self.run_dir, self.log, self.plant = run_dir, log, plant
        self.temp = Path(tempfile.mkdtemp(prefix="wr-chaos-"))  # short: a socket lives here
        self.temp.chmod(0o755)
        (self.temp / "pg").mkdir()
        (self.temp / "redis").mkdir()
        self.postgres = PrivatePostgres(self.temp / "pg")
        self.redis = PrivateRedis(self.temp / "redis")
        self.shop_secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
        self.merchant_secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
        # one of each for every process of the run
        self.fernet_key = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()
        self.django_key = secrets.token_urlsafe(50)
        self.merchant = Merchant(self.merchant_secret, run_dir / "merchant.log")
        self.services: list[Service] = []
        self.worker_generation = 0
        self.relay_generation = 0
        self.web: Gunicorn | None = None
        self.probes: Gunicorn | None = None
        self.relay: RelayProcess | None = None
        self.worker: CeleryWorker | None = None
        self.beat: CeleryBeat | None = None
        # held while a fault or the supervisor replaces the relay or the worker
        self.process_lock = threading.Lock()
        self.unplanned_exits: list[dict] = []
        # set once the clean-up begins; a fault restarts nothing after it (under `starting`)
        self.stopping = False
        self.starting = threading.Lock()
        self._supervising = threading.Event()

    @property
    def postgres_dsn(self) -> str:
        return f"host=127.0.0.1 port={self.postgres.port} user=postgres dbname=webhook_receiver"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        # (a CHAOS_PLANT left in the shell plants nothing: only --plant does)
        for name in ("GUNICORN_CMD_ARGS", "PROMETHEUS_MULTIPROC_DIR", "CELERY_METRICS_PORT",
                     PLANT_ENV):  # fmt: skip
            env.pop(name, None)
        if self.plant:
            env[PLANT_ENV] = self.plant
        redis = f"redis://127.0.0.1:{self.redis.port}"
        env.update(
            DJANGO_SETTINGS_MODULE="tests.chaos.settings",
            DATABASE_URL=self.postgres.url,
            CELERY_BROKER_URL=f"{redis}/0",
            CACHE_URL=f"{redis}/1",
            SHOP_WEBHOOK_SECRETS=self.shop_secret,
            WEBHOOK_SECRET_ENCRYPTION_KEYS=self.fernet_key,
            DJANGO_SECRET_KEY=self.django_key,
            DJANGO_DEBUG="false",
            DEMO_VAR_DIR=str(self.run_dir / "var"),
            WEBHOOK_RETRY_SWEEP_SECONDS="2",
            SHOP_RECONCILE_URL="",
            SHOP_SILENCE_AFTER_SECONDS="0",
            WEBHOOK_NOTIFIERS="log",
            EMAIL_URL="consolemail://",
            LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
        )
        return env

    def manage(self, *args: str) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=REPO, env=self.env(),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        with (self.run_dir / "manage.log").open("a") as log:
            log.write(f"$ manage.py {' '.join(args[:2])}\n{result.stdout}{result.stderr}\n")
        if result.returncode:
            raise RuntimeError(f"manage.py {args[0]} failed:\n{result.stderr[-3000:]}")
        return result.stdout

    def start(self, rate: str) -> None:
        started = time.time()
        self.postgres.create()
        self.redis.start()
        self.log(f"PostgreSQL on {self.postgres.port}, Redis on {self.redis.port}")
        self.manage("migrate", "--noinput", "--verbosity", "0")
        self.merchant.start()
        self.manage(
            "webhook_destination", "add", MERCHANT, "--url", self.merchant.url,
            "--secret", self.merchant_secret, "--events", MERCHANT_EVENTS,
            "--rate", rate, "--concurrency", "4", "--timeout", "3",
            "--max-attempts", "60", "--backoff-base", "0.5", "--backoff-cap", "5",
        )  # fmt: skip
        self.web = Gunicorn(self.env(), self.run_dir / "gunicorn.log", GUNICORN_WORKERS)
        self.services.append(self.web)
        self.web.start()
        log = self.run_dir / "gunicorn-probes.log"
        self.probes = Gunicorn(self.env(), log, PROBE_WORKERS, name="gunicorn-probes")
        self.services.append(self.probes)
        self.probes.start()
        self.relay_restart(wait=False)
        self.worker_restart(wait=False)
        self.beat_start()
        self.web.wait_ready(self.web.answers)
        self.probes.wait_ready(self.probes.answers)
        self.relay.wait_ready(self.relay.ready)
        self.worker.wait_ready(self.worker.ready)
        self.log(f"serving on {self.web.url} (started in {time.time() - started:.1f} s)")

    def beat_start(self) -> None:
        n = sum(1 for s in self.services if isinstance(s, CeleryBeat)) + 1
        log = self.run_dir / ("beat.log" if n == 1 else f"beat-{n}.log")
        self.beat = CeleryBeat(self.env(), log, self.run_dir / "beat-schedule")
        self.services.append(self.beat)
        self.beat.start()

    def supervise(self) -> None:
        """Start a relay, a worker or beat again when it exits on its own, as systemd's
        Restart=always would (a second later); each such exit is reported."""
        self._supervising.set()
        threading.Thread(target=self._supervise, daemon=True).start()

    def _supervise(self) -> None:
        while self._supervising.is_set():
            time.sleep(0.5)
            with self.process_lock:
                for service, restart in ((self.relay, self.relay_restart),
                                         (self.worker, self.worker_restart),
                                         (self.beat, self.beat_start)):  # fmt: skip
                    if service is None or service.alive() or not self._supervising.is_set():
                        continue
                    last = _last_error(service.tail(5000))
                    self.unplanned_exits.append({
                        "process": service.name, "at": time.time(), "line": last,
                        "code": service.process.returncode, "log": str(service.log),
                    })  # fmt: skip
                    self.log(f"{service.name} exited on its own ({last}); starting another")
                    time.sleep(1)
                    with self.starting:
                        if self.stopping:
                            return
                        try:
                            waits = (self.worker_restart, self.relay_restart)
                            kwargs = {"wait": False} if restart in waits else {}
                            restart(**kwargs)
                        except Exception as exc:
                            self.log(f"could not start it again: {exc!r}")

    def relay_restart(self, wait: bool = True) -> None:
        self.relay_generation += 1
        n = self.relay_generation
        self.relay = RelayProcess(self.env(), self.run_dir / f"relay-{n}.log", n)
        self.services.append(self.relay)
        self.relay.start()
        if wait:
            self.relay.wait_ready(self.relay.ready)

    def worker_restart(self, wait: bool = True) -> None:
        self.worker_generation += 1
        n = self.worker_generation
        self.worker = CeleryWorker(self.env(), self.run_dir / f"worker-{n}.log", n)
        self.services.append(self.worker)
        self.worker.start()
        if wait:
            self.worker.wait_ready(self.worker.ready)

    def stop_all(self) -> None:
        self._supervising.clear()
        with self.starting:
            self.stopping = True
        with self.process_lock:
            pass  # a restart under way has finished
        for service in reversed(self.services):
            try:
                service.stop()
            except Exception as exc:  # go on: every other process must stop too
                self.log(f"stopping {service.name}: {exc!r}")
        for stop in (self.merchant.stop, self.redis.stop, self._postgres_stop):
            try:
                stop()
            except Exception as exc:
                self.log(f"stopping: {exc!r}")
        for name, path in (("postgres.log", "pg/pg.log"), ("redis.log", "redis/redis.log")):
            if (self.temp / path).exists():
                shutil.copy(self.temp / path, self.run_dir / name)
        shutil.rmtree(self.temp, ignore_errors=True)

    def _postgres_stop(self) -> None:
        if (self.postgres.data / "postmaster.pid").exists():
            self.postgres.stop("immediate")


def _last_error(text: str) -> str:
    """The last CRITICAL or ERROR line of a log (what a process said before it died)."""
    lines = text.splitlines()
    for level in (" CRITICAL ", " ERROR "):
        for line in reversed(lines):
            if level in line:
                return line.strip()[:300]
    return (lines or ["(empty log)"])[-1][:300]


def _line_time(line: str, default: float) -> float:
    """The time a log line begins with (project/logs.py: local time, to the millisecond)."""
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return default


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--short", action="store_true", help="about 2 minutes, for CI")
    parser.add_argument("--events", type=int, help="events to send (short 2000, long 10000)")
    parser.add_argument("--out", type=Path, help="report file (default var/chaos/report.txt)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--plant", choices=sorted(PLANTS), help="plant this defect in the "
                        "served processes (docs/testing.md#the-fault-run-make-chaos): the run "
                        "must fail")  # fmt: skip
    parser.add_argument("--require-truthful-status", action="store_true", help="fail the "
                        "run when status or health did not tell a fault within 60 s, or "
                        "said OK during one (without it, the check is report-only)")  # fmt: skip
    args = parser.parse_args(argv)
    mode = "short" if args.short else "long"
    events = args.events or (2000 if args.short else 10000)
    # a planted run keeps its report apart from the real runs' (report-short-<plant>.txt)
    planted = f"-{args.plant}" if args.plant else ""
    out = args.out or REPO / "var" / "chaos" / f"report{'-short' * args.short}{planted}.txt"
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    run_dir = REPO / "var" / "chaos" / f"{stamp}-{mode}{planted}"
    run_dir.mkdir(parents=True, exist_ok=True)
    run_log = (run_dir / "run.log").open("a", buffering=1)

    def log(line: str) -> None:
        text = f"{datetime.now(UTC):%H:%M:%S} {line}"
        print(text, flush=True)
        run_log.write(text + "\n")

    signal.signal(signal.SIGTERM, raise_on_sigterm)
    wall = time.time()
    stack = Stack(run_dir, log, args.plant)
    sender: Service | None = None
    watcher: Watcher | None = None
    try:
        log(f"chaos run {stamp} ({mode}, {events} events); logs in {run_dir}")
        if args.plant:
            plant = PLANTS[args.plant]
            log(f"planted defect {plant.name}: {plant.defect}; '{plant.caught_by}' must fail")
        stack.start(rate="100/s")
        stack.supervise()
        # from before the first fault to the end of the drain: the truth table's probes
        watcher = Watcher("127.0.0.1", stack.probes.port, stack.env(), run_dir / "probes.jsonl")
        watcher.start()
        faults = Faults(stack, SHORT if args.short else LONG, log)
        duration = faults.duration()
        planned = plan_build(events, duration, args.seed, stamp.replace("-", ""))
        plan_save(planned, run_dir / "plan.json")
        requests_path = run_dir / "requests.jsonl"
        deadline = duration + 300
        sender = Service("sender", [
            sys.executable, "-m", "tests.chaos.sender", "--plan", str(run_dir / "plan.json"),
            "--url", stack.web.url, "--secret", stack.shop_secret, "--out", str(requests_path),
            "--deadline", str(deadline), "--retry-after-cap", "3" if args.short else "10",
        ], stack.env(), run_dir / "sender.log")  # fmt: skip
        stack.services.append(sender)
        send_start = time.time()
        sender.start()
        log(f"sending {events} events over about {duration:.0f} s while the faults run")
        fault_thread = threading.Thread(
            target=faults.run, args=(lambda: not sender.alive(),), daemon=True
        )
        fault_thread.start()
        # short joins: a signal that lands in another thread is seen by this one only
        # when it runs again (a long join would hold off Ctrl-C and SIGTERM)
        until = time.monotonic() + duration + 600
        while fault_thread.is_alive() and time.monotonic() < until:
            fault_thread.join(timeout=0.5)
        sender.process.wait(timeout=deadline + 60)
        send_end = time.time()
        log(f"sender done after {send_end - send_start:.0f} s; draining")
        drain_limit = time.monotonic() + DRAIN_SECONDS[mode]
        pending = (-1, -1)
        while time.monotonic() < drain_limit:
            try:
                pending = checks.settled(stack.postgres_dsn)
            except Exception as exc:  # the database may still be recovering
                log(f"drain: {exc!r}")
            if pending == (0, 0):
                break
            time.sleep(1)
        drain = time.time() - send_end
        log(f"drained in {drain:.1f} s (retrying, unsent: {pending})")
        probes, watcher = watcher.stop(), None
        table = truth_table(probes, faults.windows)
        truthful = truth_check(table, required=args.require_truthful_status)
        return _conclude(stack, faults, planned, requests_path, out, log, (table, truthful), {
            "run": stamp, "mode": mode, "events": len(planned), "commit": git_commit(),
            "send_seconds": send_end - send_start, "drain_seconds": drain,
            "wall_start": wall, "span": (send_start, send_end), "run_dir": str(run_dir),
            "planted": args.plant,
        })  # fmt: skip
    except KeyboardInterrupt:
        log("interrupted; stopping everything")
        return 130
    except Exception as exc:
        log(f"the run could not be carried out: {exc!r}")
        for service in stack.services:
            log(f"--- tail of {service.log}\n{service.tail(20)}")
        return 2
    finally:
        if watcher is not None:
            watcher.stop()
        stack.stop_all()
        log(f"stopped every process; wall time {time.time() - wall:.0f} s")
        run_log.close()


def _conclude(stack, faults, planned, requests_path, out, log, truth, meta) -> int:
    lines = requests_path.read_text().splitlines()
    tail = json.loads(lines[-1])
    requests = checks.Requests([json.loads(x) for x in lines[:-1]], tail["gave_up"], tail["open"])
    state = checks.database_state(stack.postgres_dsn)
    outages = [
        (w.start - checks.RELAXED_COMMIT_SECONDS, w.end + 5)
        for w in faults.windows
        if w.name == "postgres_stop"
    ]
    book = stack.merchant.book
    results = checks.every_check(planned, state, requests, book, outages, faults.windows)
    if faults.errors:
        results.append(checks.Check("faults: every fault carried out", False,
                                    "; ".join(faults.errors)))  # fmt: skip
    table, truthful = truth
    results.append(truthful)
    if meta["planted"]:
        results.append(_planted_check(PLANTS[meta["planted"]], results))
    effects = [e.at for e in book.effects.values()]
    latencies = checks.merchant_latencies(state, book)
    per_window = report.figures(requests, faults.windows, effects, meta.pop("span"), latencies)
    # each message of the merchant's: admitted, first arrival (null: never)
    with (stack.run_dir / "outbound.jsonl").open("w") as outbound:
        for key, at in sorted(state["admitted"].items(), key=lambda item: item[1]):
            outbound.write(json.dumps([key, at, book.arrivals.get(key)]) + "\n")
    meta["requests"] = len(requests.rows)
    meta["unplanned_exits"] = [
        exit | {"during": _during(_line_time(exit["line"], exit["at"]), faults.windows)}
        for exit in stack.unplanned_exits
    ]
    meta["worker_survived_broker_outage"] = _survived(stack.unplanned_exits, faults.windows)
    meta["requests_per_second"] = len(requests.rows) / max(meta["send_seconds"], 1e-6)
    meta["wall_seconds"] = time.time() - meta.pop("wall_start")
    names = ["run.log", "manage.log", "gunicorn.log", "gunicorn-probes.log", "beat.log",
             "sender.log", "merchant.log", "postgres.log", "redis.log", "requests.jsonl",
             "outbound.jsonl", "probes.jsonl", "plan.json"]  # fmt: skip
    names += sorted(p.name for p in stack.run_dir.glob("relay-*.log"))
    names += sorted(p.name for p in stack.run_dir.glob("worker-*.log"))
    logs = {name: str(stack.run_dir / name) for name in names}
    text = report.render(meta, results, per_window, logs, table)
    for path in (out, stack.run_dir / "report.txt"):
        report.write(path, text, meta, results, per_window, table)
    print(text, flush=True)
    log(f"report: {out} and {out.with_suffix('.json')}")
    if checks.passed(results):
        return 0
    for service in stack.services:
        log(f"--- tail of {service.log}\n{service.tail(30)}")
    return 1


def _planted_check(plant, results: list[checks.Check]) -> checks.Check:
    """Whether the check that guards against the planted defect caught it. A run with a
    defect planted fails either way: by that check, or by this one."""
    caught = any(c.name == plant.caught_by and not c.ok for c in results)
    others = [c.name for c in results
              if not c.ok and c.required and c.name != plant.caught_by]  # fmt: skip
    detail = f"{plant.defect}; '{plant.caught_by}' {'failed' if caught else 'HELD'}"
    if others:
        detail += f"; also failed: {'; '.join(others)}"
    return checks.Check(f"planted defect {plant.name}: caught by its check", caught, detail)


def _during(at: float, windows) -> str:
    """The latest fault begun before an instant, if the instant is within it or 5 s after."""
    begun = [w for w in windows if w.start <= at <= w.end + 5]
    return max(begun, key=lambda w: w.start).name if begun else "no fault"


def _survived(exits: list[dict], windows) -> bool | None:
    """Whether the worker lived through the broker outage: no exit of its own from the
    outage's start to the next fault's (None: no outage ran)."""
    ordered = sorted(windows, key=lambda w: w.start)
    for n, window in enumerate(ordered):
        if window.name == BROKER:
            until = ordered[n + 1].start if n + 1 < len(ordered) else float("inf")
            return not any(
                e["process"].startswith("celery worker") and window.start <= e["at"] < until
                for e in exits
            )
    return None
