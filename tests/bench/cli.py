"""The one entry every bench runs through: its arguments, the signals, the exit status.

A bench module gives its arguments and its run; ``bench_main`` parses the command line,
turns SIGTERM (and a SIGINT inherited as ignored) into the Ctrl-C its clean-up unwinds
through, and exits with the run's status, or 130 when interrupted.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from .server import raise_on_sigterm

Arguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


def bench_main(
    module: str,
    doc: str | None,
    arguments: Arguments,
    run: Run,
    *,
    at_least_one: Sequence[str] = (),
    stopped: str = "",
) -> NoReturn:
    """Run a bench from the command line: ``at_least_one`` names the options (dests)
    that must be >= 1, ``stopped`` what an interruption stops."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc)
    arguments(parser)
    args = parser.parse_args()
    if any(getattr(args, dest) < 1 for dest in at_least_one):
        flags = [f"--{dest.replace('_', '-')}" for dest in at_least_one]
        listed = f"{', '.join(flags[:-1])} and {flags[-1]}" if len(flags) > 1 else flags[0]
        parser.error(f"{listed} must be at least 1")
    signal.signal(signal.SIGTERM, raise_on_sigterm)
    # even when started in the background, where SIGINT is inherited as ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        sys.exit(run(args))
    except KeyboardInterrupt:
        print(f"\ninterrupted; {stopped}" if stopped else "\ninterrupted", file=sys.stderr)
        sys.exit(130)
