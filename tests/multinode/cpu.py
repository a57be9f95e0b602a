"""Who spends the CPU during a run: ``/proc`` sampled every half second, per role.

A role is a set of process groups (each gunicorn node, each Celery worker, beat: every
process the run started leads a group of its own), single processes (PgBouncer, Redis,
the merchant, this runner, which is the sender) or the PostgreSQL backends serving the
run's database (``pg_stat_activity``, read straight from PostgreSQL). A process seen
first after the phase began counts from zero. The machine's own busy share (everything
on it, other work included) comes from ``/proc/stat``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from tests.support.threads import InBackground

TICKS = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1
INTERVAL_SECONDS = 0.5


def _stat(pid: int) -> tuple[int, int] | None:
    """(process group, CPU ticks: user + system) of one process, None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    # after the ")": state ppid pgrp session ... utime (14th field) stime (15th)
    return int(fields[2]), int(fields[11]) + int(fields[12])


def _machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


@dataclass
class Usage:
    seconds: float  # the phase's wall time
    roles: dict[str, float]  # CPU seconds per role
    machine_busy: float  # share of all cores busy, everything on the machine

    def cores(self, role: str) -> float:
        return self.roles.get(role, 0.0) / self.seconds if self.seconds else 0.0

    def per_item_ms(self, items: int) -> dict[str, float]:
        """CPU milliseconds each role spent per item (event, delivery): a ratio that
        holds however busy the shared machine was."""
        return {role: round(cpu * 1000 / items, 3) for role, cpu in sorted(self.roles.items())}

    def table(self) -> dict[str, float]:
        """Cores used by each role, on average over the phase."""
        return {role: round(self.cores(role), 3) for role in sorted(self.roles)}


class Sampler(InBackground):
    """Sample while a phase runs (a context manager); ``usage`` afterwards."""

    join_seconds = 10.0

    def __init__(
        self,
        groups: dict[int, str],
        single: dict[int, str],
        changing: Callable[[], dict[int, str]] | None = None,
    ) -> None:
        self.groups = groups  # process group -> role
        self.single = single  # pid -> role
        self.changing = changing  # pid -> role, asked again at each sample
        self._seen: dict[int, tuple[str, int, int]] = {}  # pid -> (role, first, last)
        self._first = True

    def __enter__(self) -> Sampler:
        self._began = time.monotonic()
        self._machine = _machine_ticks()
        self._sample()
        self._first = False
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._sample()
        seconds = time.monotonic() - self._began
        busy, total = _machine_ticks()
        busy_share = (busy - self._machine[0]) / max(1, total - self._machine[1])
        roles: dict[str, float] = defaultdict(float)
        for role, first, last in self._seen.values():
            roles[role] += (last - first) / TICKS
        self.usage = Usage(seconds, dict(roles), busy_share)

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_SECONDS):
            self._sample()

    def _sample(self) -> None:
        found: dict[int, str] = {}
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if pid in self.single:
                found[pid] = self.single[pid]
                continue
            stat = _stat(pid)
            if stat is not None and stat[0] in self.groups:
                found[pid] = self.groups[stat[0]]
        if self.changing is not None:
            # a sample missed is no failure of the run
            with contextlib.suppress(Exception):
                found |= self.changing()
        for pid, role in found.items():
            stat = _stat(pid)
            if stat is None:
                continue
            ticks = stat[1]
            if pid in self._seen:
                _, first, _ = self._seen[pid]
                self._seen[pid] = (role, first, ticks)
            else:
                self._seen[pid] = (role, ticks if self._first else 0, ticks)
