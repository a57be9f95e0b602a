"""A scenario's frozen inputs: destinations and their merchants' faults, admissions, relay
crashes, a sender's traffic, beat's intervals and the relay processes, as the run reads
them (scenario.py reads them from a file and checks them)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BUILT_IN = Path(__file__).resolve().parent / "scenarios"

# a run's simulated time at most: a month, as retention horizons go
MAX_DURATION = 31 * 86400
# a fixed Monday morning: a report never depends on the day it was run
DEFAULT_START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
# relay processes at most in a run (each an engine on the run's one simulated loop)
MAX_RELAYS = 16


@dataclass(frozen=True)
class Window:
    start: float  # seconds from the scenario's start
    end: float

    def holds(self, at: float) -> bool:
        return self.start <= at < self.end


@dataclass(frozen=True)
class Fault:
    """How a simulated merchant misbehaves for some requests: an answer (``status``,
    with ``retry_after``), a response lost after it committed, a timeout, being down
    (connection refused), or a slow answer (``slow: 30s``: the answer it would give,
    that long after the request; past the destination's timeout it is a timeout, with
    the effect applied). ``delay`` goes with ``status`` and ``lose_response`` too. It
    applies to the keys of a seeded ``share`` (the same keys for every fault of the same
    ``group``), on the merchant's ``attempts`` of a key (1 is the first request it sees
    of that key; empty: every one), to ``events`` (empty: all), inside ``window`` (None:
    always)."""

    kind: str  # "status", "lose_response", "timeout", "down", "slow"
    status: int | None = None
    # seconds the answer takes (None: the destination's ``delay``)
    delay: float | None = None
    retry_after: str | None = None
    attempts: tuple[int, ...] = ()
    share: float = 1.0
    group: str = "default"
    events: tuple[str, ...] = ()
    window: Window | None = None


@dataclass(frozen=True)
class Recovery:
    """An operator starts a recovery job of its destination at ``at`` (outbound/recovery.py,
    scope every tenant, by "ops"): of ``kind`` recover (its failed messages, each sent
    again under its key with a fresh retry budget), among the messages admitted from
    ``since`` to ``until`` (offsets from the start; None: no end), of ``events`` (names as
    in admissions; empty: all) whose last answer is of ``answers`` (``2xx`` … ``5xx``,
    ``none``; empty: any), at ``rate`` a second (None: half the destination's)."""

    at: float
    kind: str = "recover"
    since: float = 0.0
    until: float | None = None
    rate: float | None = None
    events: tuple[str, ...] = ()
    answers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Destination:
    name: str
    rate_count: int = 10
    rate_seconds: float = 1.0
    burst: int = 10
    max_in_flight: int = 4
    timeout_seconds: float = 10.0
    max_attempts: int = 12
    backoff_base_seconds: float = 2.0
    backoff_cap_seconds: float = 3600.0
    retry_after_cap_seconds: float = 300.0
    breaker_threshold: int = 10
    breaker_cooldown_seconds: float = 60.0
    # seconds every answer takes, unless a fault says otherwise
    delay_seconds: float = 0.0
    faults: tuple[Fault, ...] = ()
    # when an operator enables it again (after the relay disabled it: a 410 Gone)
    enable_at: float | None = None
    # when an operator starts a recovery job of it (its failed messages sent again)
    recovery: Recovery | None = None


@dataclass(frozen=True)
class Repeat:
    """Admit a share of the keys again, ``after`` their first admission."""

    share: float
    after: float


@dataclass(frozen=True)
class Admissions:
    """Orders whose events are admitted to the outbox: ``orders`` of them, evenly
    spread over ``over`` from ``start``; each order's ``events`` ``gap`` apart, to
    ``destinations`` (empty: all), under one ordering key per order if ``ordering``."""

    orders: int
    start: float = 0.0
    over: float = 60.0
    events: tuple[str, ...] = ("paid",)
    gap: float = 1.0
    destinations: tuple[str, ...] = ()
    ordering: bool = False
    repeats: tuple[Repeat, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)
    prefix: str = "ord"


@dataclass(frozen=True)
class Crash:
    """The relay of ``destination`` dies at ``at``, after claiming (``after: claim``) or
    after sending (``after: send``), before recording anything."""

    at: float
    destination: str
    after: str = "send"


@dataclass(frozen=True)
class Inbound:
    """A sender posting signed events to this app's receiver: ``events`` evenly over
    ``over``; a share redelivered (``duplicates``, ``after`` the first), a share
    delivered late (``late``, by up to ``by``: out of order), quiet during ``silent``
    windows, and a share whose handler fails after writing its effect on the first try
    (``fail_after_effect``: the claim's transaction must take the effect back)."""

    events: int
    over: float = 600.0
    silence_after: float = 1200.0
    duplicates: float = 0.0
    duplicates_after: float = 30.0
    late: float = 0.0
    late_by: float = 300.0
    silent: tuple[Window, ...] = ()
    fail_after_effect: float = 0.0


@dataclass(frozen=True)
class Beat:
    retry_sweep: float = 15.0
    silence_check: float = 60.0


@dataclass(frozen=True)
class Relay:
    """The relay processes (``manage.py webhook_relay``), and how often each polls for
    due messages (RELAY_POLL_SECONDS); an admission wakes them at once, as LISTEN does."""

    processes: int = 1
    poll: float = 1.0


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    duration: float
    destinations: tuple[Destination, ...] = ()
    admissions: tuple[Admissions, ...] = ()
    crashes: tuple[Crash, ...] = ()
    inbound: Inbound | None = None
    beat: Beat = Beat()
    relay: Relay = Relay()
    start: datetime = DEFAULT_START
    # a destination whose deliveries must not change when the others are removed
    isolated: tuple[str, ...] = ()
    path: str = ""

    def only(self, names: tuple[str, ...]) -> Scenario:
        """The same scenario with only the destinations ``names`` (the counterfactual
        the isolation invariant compares with)."""
        keep = set(names)
        admissions = []
        for a in self.admissions:
            targets = tuple(d for d in (a.destinations or self.names()) if d in keep)
            if targets:
                admissions.append(replace(a, destinations=targets))
        return replace(
            self,
            destinations=tuple(d for d in self.destinations if d.name in keep),
            admissions=tuple(admissions),
            crashes=tuple(c for c in self.crashes if c.destination in keep),
            inbound=None,
            isolated=(),
        )

    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.destinations)
