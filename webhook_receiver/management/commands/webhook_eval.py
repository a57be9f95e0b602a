"""manage.py webhook_eval [SCENARIO …] [--seed N] [--html FILE] [--save FILE] [--compare FILE]
[--force]

Prove the delivery policy before deployment: run scenarios (the built-in ones, or
files a team writes) through the app's real code in simulated time, in a database of
their own, and check the invariants after each. See docs/eval.md.

Exit status: 0 when every invariant held (and, with --compare, nothing regressed);
1 when an invariant broke or a run is void; 2 when --compare found a regression;
3 when a scenario or a saved run cannot be read (or asks for too much), the run
cannot make its database, or the harness's dependencies are not installed (the eval
extra); 130 on Ctrl-C and 143 on SIGTERM, its database dropped.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

# the harness's own dependencies: the eval extra installs them, and a host need not
HARNESS_NEEDS = {"time_machine", "yaml", "pydantic", "pydantic_core"}
DISTRIBUTION = "django-webhook-inbox"

try:
    from ...evaluation import report, scenario
    from ...evaluation.html import html_report
    from ...evaluation.run import RunRefused, evaluate_all, own_database
except ImportError as exc:
    if exc.name not in HARNESS_NEEDS:
        raise
    missing: str | None = exc.name
else:
    missing = None


class Command(BaseCommand):
    help = (
        "Run delivery scenarios through the app's real code in simulated time (a database "
        "of their own, a simulated network) and check the invariants: one message and one "
        "effect per key, FIFO, order within a key, the limiter, retry timing, the ledger. "
        "Without a scenario, the built-in ones."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "scenarios",
            nargs="*",
            metavar="SCENARIO",
            help="a built-in scenario's name or a scenario file (.yaml, .json); "
            "none: every built-in one",
        )
        parser.add_argument("--seed", type=int, default=1, help="the run's seed (default 1)")
        parser.add_argument("--html", metavar="FILE", help="also write the report as one HTML file")
        parser.add_argument("--save", metavar="FILE", help="write the run as JSON (for --compare)")
        parser.add_argument("--compare", metavar="FILE", help="compare with a run saved by --save")
        parser.add_argument(
            "--list", action="store_true", help="list the built-in scenarios and stop"
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="if the run's database (<NAME>_webhook_eval) was left behind by an earlier "
            "run that was killed, drop it and make it afresh (without: refuse); a database "
            "of that name no run made is never dropped",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if missing is not None:
            # one line, not a traceback: the app runs without the harness's dependencies
            raise CommandError(
                f"webhook_eval needs the evaluation harness's dependencies ({missing} is not "
                f'installed): pip install "{DISTRIBUTION}[eval]"',
                returncode=3,
            )
        if options["list"]:
            for name in scenario.built_in_names():
                loaded = scenario.load(name)
                self.stdout.write(f"{name:<24} {loaded.description}")
            return
        try:
            scenarios = [
                scenario.load(n) for n in options["scenarios"] or scenario.built_in_names()
            ]
            saved = _read_saved(options["compare"]) if options["compare"] else None
        except (scenario.ScenarioError, ValueError, OSError) as exc:
            self.stderr.write(f"webhook_eval: {exc}")
            sys.exit(3)
        verbosity = options["verbosity"]
        app_logger = logging.getLogger("webhook_receiver")
        level = app_logger.level
        # the app's own lines (with simulated times) only when asked for: -v 2
        app_logger.setLevel(logging.DEBUG if verbosity >= 2 else logging.CRITICAL)
        try:
            with own_database(verbosity, force=options["force"], say=self.stderr.write):
                export = evaluate_all(
                    scenarios,
                    seed=options["seed"],
                    progress=(lambda name: self.stderr.write(f"running {name} …"))
                    if verbosity
                    else None,
                )
        except RunRefused as exc:
            self.stderr.write(f"webhook_eval: {exc}")
            sys.exit(3)
        except KeyboardInterrupt:
            # its database is dropped, and said so: no traceback for a Ctrl-C
            sys.exit(130)
        finally:
            app_logger.setLevel(level)
        self.stdout.write(report.text_report(export), ending="")
        if options["save"]:
            _write(options["save"], json.dumps(export, indent=1, sort_keys=True) + "\n")
            self.stderr.write(f"saved the run to {options['save']}")
        if options["html"]:
            _write(options["html"], html_report(export))
            self.stderr.write(f"wrote the report to {options['html']}")
        regressions: list[str] = []
        if saved is not None:
            regressions, changes = report.compare(export, saved)
            self.stdout.write(report.compare_text(regressions, changes, options["compare"]))
        if not export["held"]:
            sys.exit(1)
        if regressions:
            sys.exit(2)


def _write(path: str, text: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")


def _read_saved(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a saved run (invalid JSON: {exc})") from None
    if not isinstance(data, dict) or data.get("format") != 1 or "scenarios" not in data:
        raise ValueError(f"{path}: not a run saved by webhook_eval --save (format 1)")
    return data
