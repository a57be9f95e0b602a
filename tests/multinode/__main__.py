"""``python -m tests.multinode [--events N] [--out FILE]``: one run of the scenario
(see ``tests.multinode.scenario``), its report printed and written as JSON. Exits 1
when a check failed. ``--measure`` runs the figures of docs/deploying.md instead
(``tests.multinode.measure``)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from tests.bench.server import raise_on_sigterm

from .cluster import Layout, pgbouncer_binary, postgres_answers
from .scenario import Options, report_lines, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.multinode", description=__doc__)
    parser.add_argument("--events", type=int, default=1200, help="events to send (about)")
    parser.add_argument("--out", type=Path, help="write the report here (JSON)")
    parser.add_argument("--threads", type=int, default=8, help="sender threads")
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn workers a node")
    parser.add_argument("--pool-size", type=int, default=8, help="PgBouncer default_pool_size")
    parser.add_argument("--rate", type=int, default=40, help="the destination's starts a second")
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=4, help="its requests in flight")
    parser.add_argument("--no-restart", action="store_true", help="leave PgBouncer running")
    parser.add_argument("--keep-logs", type=Path, help="copy every process's log here")
    parser.add_argument("--measure", action="store_true", help="the figures (docs/deploying.md)")
    args, rest = parser.parse_known_args(argv)
    if pgbouncer_binary() is None or not postgres_answers():
        print("needs PostgreSQL at 127.0.0.1:5432 and pgbouncer (apt-get install pgbouncer)")
        return 2
    signal.signal(signal.SIGTERM, raise_on_sigterm)  # clean up as on Ctrl-C
    if args.measure:
        from .measure import main as measure_main

        return measure_main(rest, out=args.out)
    if rest:
        parser.error(f"unknown arguments: {rest}")
    options = Options(
        events=args.events,
        threads=args.threads,
        rate=args.rate,
        burst=args.burst,
        concurrency=args.concurrency,
        restart_at=-1 if args.no_restart else 0.4,
        layout=Layout(web_workers=args.web_workers, pool_size=args.pool_size),
        keep_logs=args.keep_logs,
    )
    report = run(options)
    for line in report_lines(report):
        print(line)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
