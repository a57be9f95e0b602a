"""A scenario's frozen inputs, as pydantic models of its file's format: destinations and
their merchants' faults, admissions, relay crashes, a sender's traffic, beat's intervals
and the relay processes. A key is the file's word (``timeout``, ``repeat``, ``from``);
where the run reads another name, the field has it and the file's word is its alias
(``timeout_seconds``, ``repeats``, ``start``).

Validating a file's data checks each value (reading.py: durations, rates, times, names)
and the rules that span keys; scenario.py adds the bounds (bounds.py), reads the file
and says what is wrong. The format is documented in docs/eval.md."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    Strict,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .reading import (
    Count,
    Moment,
    PerSecond,
    PositiveSeconds,
    Rate,
    Seconds,
    Share,
    Slug,
    Text,
    refusal,
    shown,
)

BUILT_IN = Path(__file__).resolve().parent / "scenarios"

# a run's simulated time at most: a month, as retention horizons go
MAX_DURATION = 31 * 86400
# a fixed Monday morning: a report never depends on the day it was run
DEFAULT_START = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
# relay processes at most in a run (each an engine on the run's one simulated loop)
MAX_RELAYS = 16


class Part(BaseModel):
    """A mapping of the format: a key it does not know is refused; read, it is frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # keys of an older format, and what to write instead
    retired: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _no_retired_key(cls, data: Any) -> Any:
        for key, instead in cls.retired.items():
            if isinstance(data, dict) and key in data:
                raise refusal(key, instead)
        return data


# --- destinations -------------------------------------------------------------------------

FAULT_KINDS = ("status", "lose_response", "timeout", "down", "slow")


class Fault(Part):
    """How a simulated merchant misbehaves for some requests: an answer (``status``,
    with ``retry_after``), a response lost after it committed, a timeout, being down
    (connection refused), or a slow answer (``slow: 30s``: the answer it would give,
    that long after the request; past the destination's timeout it is a timeout, with
    the effect applied). ``delay`` goes with ``status`` and ``lose_response`` too. It
    applies to the keys of a seeded ``share`` (the same keys for every fault of the same
    ``group``), on the merchant's ``attempts`` of a key (1 is the first request it sees
    of that key; empty: every one), to ``events`` (empty: all), from ``from`` until
    ``until`` (default: always)."""

    status: Annotated[int, Strict(), Field(ge=100, le=599)] | None = None
    lose_response: Literal[True] | None = None
    timeout: Literal[True] | None = None
    down: Literal[True] | None = None
    slow: PositiveSeconds | None = None
    # seconds the answer takes (None: the destination's ``delay``); ``slow`` is its own
    given_delay: Seconds | None = Field(None, alias="delay")
    retry_after: Annotated[str, PlainValidator(str)] | None = None
    attempts: tuple[Count, ...] = ()
    share: Share = 1.0
    group: Text = "default"
    events: tuple[Text, ...] = ()
    start: Seconds = Field(0.0, alias="from")
    end: Seconds = Field(float(10**9), alias="until")

    @field_validator("lose_response", "timeout", "down", mode="before")
    @classmethod
    def _written_true(cls, value: Any) -> Any:
        if value is not True:
            raise refusal("", "write it as `true`")
        return value

    @field_validator("status")
    @classmethod
    def _an_error(cls, status: int | None) -> int | None:
        if status is not None and 200 <= status < 300:
            raise refusal("", f"{status} is not an HTTP error status (300-599)")
        return status

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        kinds = [kind for kind in FAULT_KINDS if getattr(self, kind) is not None]
        if len(kinds) != 1:
            raise refusal("", f"give exactly one of {', '.join(FAULT_KINDS)}")
        if self.given_delay is not None and self.kind in ("timeout", "down"):
            raise refusal("delay", f"a {self.kind} takes no delay of its own")
        return self

    @property
    def kind(self) -> str:
        """The one kind the fault gives: status, lose_response, timeout, down or slow."""
        return next(kind for kind in FAULT_KINDS if getattr(self, kind) is not None)

    @property
    def delay(self) -> float | None:
        """Seconds the answer takes (None: the destination's ``delay``)."""
        return self.slow if self.slow is not None else self.given_delay

    def applies_at(self, at: float) -> bool:
        return self.start <= at < self.end


class Recovery(Part):
    """An operator starts a recovery job of its destination at ``at`` (outbound/recovery.py,
    scope every tenant, by "ops"): of ``kind`` recover (its failed messages, each sent
    again under its key with a fresh retry budget), among the messages admitted from
    ``since`` to ``until`` (offsets from the start; None: no end), of ``events`` (names as
    in admissions; empty: all) whose last answer is of ``answers`` (``2xx`` … ``5xx``,
    ``none``; empty: any), at ``rate`` a second (None: half the destination's)."""

    at: Seconds
    kind: Text = "recover"
    since: Seconds = 0.0
    until: Seconds | None = None
    rate: PerSecond | None = None
    events: tuple[Slug, ...] = ()
    answers: tuple[Text, ...] = ()

    @field_validator("kind")
    @classmethod
    def _simulated(cls, kind: str) -> str:
        unsimulated = {
            "replay": "sends delivered keys again, which the invariants hold to one send",
            "missing": "writes messages no admission made, which the ledger does not count",
        }
        if kind in unsimulated:
            why = unsimulated[kind]
            raise refusal("", f"a run simulates no {kind} job (it {why}): write `recover`")
        if kind != "recover":
            raise refusal("", f"{shown(kind)}: write `recover` (its failed messages)")
        return kind

    @field_validator("answers")
    @classmethod
    def _answer_classes(cls, answers: tuple[str, ...]) -> tuple[str, ...]:
        # imported here: the format's words are the service's own (outbound/recovery.py)
        from ..outbound.recovery import ANSWER_CLASSES

        for answer in answers:
            if answer not in ANSWER_CLASSES:
                raise refusal("", f"{shown(answer)}: one of {', '.join(ANSWER_CLASSES)}")
        return answers

    @model_validator(mode="after")
    def _a_span_before_it(self) -> Self:
        if self.since >= self.at:
            raise refusal("since", "must come before `at`: a job selects what was admitted")
        if self.until is not None and self.until <= self.since:
            raise refusal("until", "must come after `since`")
        return self


class Destination(Part):
    name: Slug
    rate: Rate = (10, 1.0)
    burst: Count = 10
    max_in_flight: Count = 4
    timeout_seconds: PositiveSeconds = Field(10.0, alias="timeout")
    max_attempts: Count = 12
    backoff_base_seconds: PositiveSeconds = Field(2.0, alias="backoff_base")
    backoff_cap_seconds: PositiveSeconds = Field(3600.0, alias="backoff_cap")
    retry_after_cap_seconds: PositiveSeconds = Field(300.0, alias="retry_after_cap")
    breaker_threshold: Count = 10
    breaker_cooldown_seconds: PositiveSeconds = Field(60.0, alias="breaker_cooldown")
    # seconds every answer takes, unless a fault says otherwise
    delay_seconds: Seconds = Field(0.0, alias="delay")
    faults: tuple[Fault, ...] = ()
    # when an operator enables it again (after the relay disabled it: a 410 Gone)
    enable_at: Seconds | None = None
    # when an operator starts a recovery job of it (its failed messages sent again)
    recovery: Recovery | None = None

    @property
    def rate_count(self) -> int:
        return self.rate[0]

    @property
    def rate_seconds(self) -> float:
        return self.rate[1]

    @model_validator(mode="after")
    def _recovery_below_its_rate(self) -> Self:
        ceiling = self.rate_count / self.rate_seconds
        asked = self.recovery.rate if self.recovery is not None else None
        if asked is not None and asked >= ceiling:
            raise refusal(
                "recovery.rate",
                f"{asked:g}/s: write a rate below the destination's own ({ceiling:g}/s), so "
                "that live traffic keeps its share",
            )
        return self


# --- traffic ------------------------------------------------------------------------------


class Repeat(Part):
    """Admit a share of the keys again, ``after`` their first admission."""

    share: Share
    after: Seconds


class Admissions(Part):
    """Orders whose events are admitted to the outbox: ``orders`` of them, evenly
    spread over ``over`` from ``start``; each order's ``events`` ``gap`` apart, to
    ``destinations`` (empty: all), under one ordering key per order if ``ordering``."""

    orders: Count
    start: Seconds = 0.0
    over: Seconds = 60.0
    events: tuple[Slug, ...] = Field(("paid",), min_length=1)
    gap: Seconds = 1.0
    destinations: tuple[Text, ...] = ()
    ordering: StrictBool = False
    repeats: tuple[Repeat, ...] = Field((), alias="repeat")
    # checked as admission checks it, with the bounds (bounds.py)
    metadata: dict[str, Any] = Field(default_factory=dict)
    prefix: Slug = "ord"


class Crash(Part):
    """The relay of ``destination`` dies at ``at``, after claiming (``after: claim``) or
    after sending (``after: send``), before recording anything."""

    at: Seconds
    destination: Text
    after: Literal["claim", "send"] = "send"


class Redeliveries(Part):
    share: Share = 0.0
    after: Seconds = 30.0


class Lateness(Part):
    share: Share = 0.0
    by: Seconds = 300.0


class SilentSpan(Part):
    """A span of the run (offsets from its start) in which the sender says nothing."""

    start: Seconds = Field(alias="from")
    end: Seconds = Field(alias="until")

    @model_validator(mode="after")
    def _until_after_from(self) -> Self:
        if self.end <= self.start:
            raise refusal("", "`until` must come after `from`")
        return self

    def holds(self, at: float) -> bool:
        return self.start <= at < self.end


class Inbound(Part):
    """A sender posting signed events to this app's receiver: ``events`` evenly over
    ``over``; a share redelivered (``duplicates``, ``after`` the first), a share
    delivered late (``late``, by up to ``by``: out of order), quiet during ``silent``
    spans, and a share whose handler fails after writing its effect on the first try
    (``fail_after_effect``: the claim's transaction must take the effect back)."""

    events: Count
    over: Seconds = 600.0
    silence_after: Seconds = 1200.0
    duplicates: Redeliveries = Redeliveries()
    late: Lateness = Lateness()
    silent: tuple[SilentSpan, ...] = ()
    fail_after_effect: Share = 0.0


# --- the run ------------------------------------------------------------------------------


class Beat(Part):
    retired = {
        "relay_sweep": "the relay polls for due messages itself (its own process, since 0.2): "
        "say relay: {poll: …}"
    }

    retry_sweep: PositiveSeconds = 15.0
    silence_check: PositiveSeconds = 60.0


class Relay(Part):
    """The relay processes (``manage.py webhook_relay``), and how often each polls for
    due messages (RELAY_POLL_SECONDS); an admission wakes them at once, as LISTEN does."""

    processes: Annotated[int, Strict(), Field(ge=1, le=MAX_RELAYS)] = 1
    poll: PositiveSeconds = 1.0


class Scenario(Part):
    retired = {
        "workers": "the relay is a process of its own since 0.2, and beat's tasks take no "
        "simulated time: say relay: {processes: …}"
    }

    name: Text
    description: Annotated[str, Strict()] = ""
    duration: Seconds
    start: Moment = DEFAULT_START
    destinations: tuple[Destination, ...] = ()
    admissions: tuple[Admissions, ...] = ()
    crashes: tuple[Crash, ...] = ()
    inbound: Inbound | None = None
    beat: Beat = Beat()
    relay: Relay = Relay()
    # a destination whose deliveries must not change when the others are removed
    isolated: tuple[Text, ...] = ()
    # the file it was read from (the validation's context), never a key of the file
    _path: str = PrivateAttr("")

    @field_validator("start", mode="before")
    @classmethod
    def _empty_start(cls, start: Any) -> Any:
        # `start:` left empty is the default, as the key left out is
        return DEFAULT_START if start is None else start

    @field_validator("duration")
    @classmethod
    def _at_most_a_month(cls, duration: float) -> float:
        if duration > MAX_DURATION:
            raise refusal("", f"at most {MAX_DURATION // 86400:g} days of simulated time")
        return duration

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Self:
        names = list(self.names())
        if len(set(names)) != len(names):
            raise refusal("destinations", "two destinations share a name")
        named = [
            (f"admissions[{i}].destinations", a.destinations) for i, a in enumerate(self.admissions)
        ]
        named += [
            (f"crashes[{i}].destination", (c.destination,)) for i, c in enumerate(self.crashes)
        ]
        named.append(("isolated", self.isolated))
        for at, given in named:
            for name in given:
                if name not in names:
                    raise refusal(at, f"{shown(name)} is not one of the destinations {names}")
        if not self.admissions and self.inbound is None:
            raise refusal("", "nothing happens: give it admissions, inbound events, or both")
        if self.admissions and not self.destinations:
            raise refusal("destinations", "admissions need at least one destination")
        self._path = (info.context or {}).get("path", "")
        return self

    @property
    def path(self) -> str:
        return self._path

    def only(self, names: tuple[str, ...]) -> Scenario:
        """The same scenario with only the destinations ``names`` (the counterfactual
        the isolation invariant compares with)."""
        keep = set(names)
        admissions = []
        for a in self.admissions:
            targets = tuple(d for d in (a.destinations or self.names()) if d in keep)
            if targets:
                admissions.append(a.model_copy(update={"destinations": targets}))
        return self.model_copy(
            update={
                "destinations": tuple(d for d in self.destinations if d.name in keep),
                "admissions": tuple(admissions),
                "crashes": tuple(c for c in self.crashes if c.destination in keep),
                "inbound": None,
                "isolated": (),
            }
        )

    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.destinations)
