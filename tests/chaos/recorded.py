"""A chaos run on record, without servers: what a correct run of a small plan leaves in
the database (the dict ``checks.database_state`` reads), in the merchant's book and in the
sender's ``requests.jsonl``. ``test_planted_defects.py`` feeds the end-of-run checks this
record, and the same record with one defect planted in it.

It is a real run in small: events applied in the order they arrive (an order move older
than its order's state is recorded stale, and sends nothing), concurrent copies answered
as duplicates, the requests sent while the database was down answered 503 and sent again,
one tampered and one stale request refused, one event deferred under a lock and applied
by the retry sweep, one dead-lettered when its retries ran out, and one message answered
500 by the merchant before it was delivered. Six noisy neighbours were subscribed for a
while (their messages, pending or failed, are counted apart), and the merchant received
each of its messages a tenth of a second after its admission, beside them or not.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from tests.chaos.checks import Check, Requests, every_check
from tests.chaos.faults import NOISY, Window
from tests.chaos.merchant import Effect, MerchantBook
from tests.chaos.plan import PlannedEvent, plan_build

RUN_ID = "rec"
START = 1_700_000_000.0  # when sending began, on the record's clock
OUTAGE = (START + 2.0, START + 3.0)  # the database down: verified requests answered 503
RESENT_AFTER = 0.25  # a 503's request sent again this long after the outage
# the noisy neighbours' window, and its hold (every neighbour subscribed)
NEIGHBOURS = (START + 5.0, START + 8.0)
NEIGHBOURS_HOLD = (START + 5.5, START + 7.5)
LATENCY = 0.1  # admission to the merchant's first arrival, every message
ANSWER_SECONDS = 0.02
LOCK_TIMEOUT = ("OperationalError", "canceling statement due to lock timeout")
STATUS_OF = {"order.paid": "paid", "order.cancelled": "cancelled", "order.fulfilled": "fulfilled"}
REFUSAL_OF = {"tamper": "invalid_signature", "stale": "timestamp_out_of_tolerance"}


@dataclass
class RecordedRun:
    planned: list[PlannedEvent]
    state: dict[str, Any]
    book: MerchantBook
    requests: Requests
    outages: list[tuple[float, float]]
    windows: list[Window]
    deferred: PlannedEvent  # deferred under a lock, then applied by the retry sweep
    dead_letter: PlannedEvent  # deferred, then dead when its retries ran out
    answered_500: str  # the message the merchant answered 500 once before its effect

    def checks(self) -> list[Check]:
        return every_check(
            self.planned, self.state, self.requests, self.book, self.outages, self.windows
        )

    def failed(self) -> dict[str, str]:
        """The detail of each check that failed, by the check's name."""
        return {check.name: check.detail for check in self.checks() if not check.ok}

    def event(self, msg_id: str) -> PlannedEvent:
        return next(e for e in self.planned if e.msg_id == msg_id)

    def admitted_beside_the_neighbours(self) -> list[str]:
        """The merchant's messages admitted in the noisy neighbours' hold."""
        start, end = NEIGHBOURS_HOLD
        return [k for k, at in self.state["admitted"].items() if start <= at <= end]

    def messages_of(self, order_id: str) -> list[str]:
        """An order's messages in the order the merchant first applied them."""
        return [k for k in self.book.order if self.book.effects[k].order_id == order_id]


def message_key(event: PlannedEvent) -> str:
    """The outbox key the shop gives an order move (``order_event_forward``)."""
    return f"order:{event.order_id}:{event.type.removeprefix('order.')}:v{event.version}"


def recorded_run(events: int = 60, seed: int = 5) -> RecordedRun:
    planned = plan_build(events, duration=10.0, seed=seed, run_id=RUN_ID)
    single = [e for e in planned if e.copies == 1 and _sent_at(e) > OUTAGE[1]]
    inventory = [e for e in single if e.type.startswith("inventory.")]
    deferred, dead_letter = inventory[0], inventory[1]
    # a plan this small has no hostile request by chance: one of each, on order moves
    moves = [e for e in single if e.type.startswith("order.")]
    moves[0].tamper, moves[1].stale = True, True

    # when each event was first taken: its first request, or the one sent again after
    # a 503 of the outage (the other copies, at the same moment, find it taken)
    arrival = {e.msg_id: _taken_at(_sent_at(e)) for e in planned}
    outcome: dict[str, str] = {}  # the first copy's answer
    receipts: dict[str, str] = {}
    ledger_rows: dict[str, int] = {}
    ledger_sums: dict[str, int] = defaultdict(int)
    orders: dict[str, tuple[str, int]] = {}
    admitted: list[PlannedEvent] = []  # order moves that sent a message, in admission order
    for event in sorted(planned, key=lambda e: arrival[e.msg_id]):
        key = event.msg_id
        if event is deferred or event is dead_letter:
            outcome[key] = "deferred"
            if event is dead_letter:
                continue
        if event.type.startswith("inventory."):
            sign = -1 if event.type == "inventory.reserved" else 1
            for sku, quantity in event.lines:
                ledger_sums[sku] += sign * quantity
            ledger_rows[key] = len(event.lines)
            receipts[key] = "applied"
        elif orders.get(event.order_id, ("", 0))[1] < event.version:
            orders[event.order_id] = (STATUS_OF[event.type], event.version)
            admitted.append(event)
            receipts[key] = "applied"
        else:
            receipts[key] = "stale"
        outcome.setdefault(key, receipts[key])

    rows, audits, refusals = _requests(planned, outcome)
    outbox: dict[str, tuple[str, str, str, int]] = {}
    admitted_at: dict[str, float] = {}
    book = MerchantBook()
    for n, event in enumerate(admitted):
        key = message_key(event)
        status, version = STATUS_OF[event.type], event.version
        attempts = 2 if n == 0 else 1  # the first message: a 500, then delivered
        outbox[key] = ("delivered", event.msg_id, "", attempts)
        admitted_at[key] = arrival[event.msg_id]
        book.arrivals[key] = arrival[event.msg_id] + LATENCY
        book.deliveries[key] = attempts
        book.answers["500"] += attempts - 1
        at = arrival[event.msg_id] + LATENCY * attempts
        book.effects[key] = Effect(key, event.order_id, status, version, at)
        book.order.append(key)
        book.answers["applied"] += 1
    state = {
        "receipts": receipts,
        "failed": {deferred.msg_id: ("resolved", *LOCK_TIMEOUT),
                   dead_letter.msg_id: ("dead", *LOCK_TIMEOUT)},
        "ledger_rows": ledger_rows,
        "ledger_sums": dict(ledger_sums),
        "evil_ledger": [],
        "orders": orders,
        "outbox": outbox,
        "admitted": admitted_at,
        # the neighbours' messages: never answered, or answered 503 until disabled
        "neighbours": {f"neighbour-{n}": {"pending": 3} if n < 4 else {"pending": 2, "failed": 1}
                       for n in range(6)},
        "audits": audits,
        "tallies": [(reason, n, 0) for reason, n in sorted(refusals.items())],
    }  # fmt: skip
    return RecordedRun(
        planned=planned,
        state=state,
        book=book,
        requests=Requests(rows, gave_up=[], open=0),
        outages=[OUTAGE],
        windows=[
            Window("postgres_stop", *OUTAGE),
            Window(NOISY, *NEIGHBOURS, "(6 bad destinations)", hold=NEIGHBOURS_HOLD),
        ],
        deferred=deferred,
        dead_letter=dead_letter,
        answered_500=message_key(admitted[0]),
    )


def _sent_at(event: PlannedEvent) -> float:
    return START + event.at


def _down(t: float) -> bool:
    return OUTAGE[0] <= t <= OUTAGE[1]


def _taken_at(sent: float) -> float:
    return OUTAGE[1] + RESENT_AFTER if _down(sent) else sent


def _requests(
    planned: list[PlannedEvent], outcome: dict[str, str]
) -> tuple[list[list], list[tuple], Counter]:
    """The sender's rows, the audit records of the requests that reached the database,
    and the refusals it tallied, by reason."""
    rows: list[list] = []
    audits: list[tuple] = []
    refusals: Counter = Counter()

    def request(msg_id: str, kind: str, copy: int, attempt: int, t0: float, status: int,
                answer: str) -> None:  # fmt: skip
        rows.append([msg_id, kind, copy, attempt, t0, t0 + ANSWER_SECONDS, status, answer, ""])

    for event in planned:
        sent = _sent_at(event)
        kinds = ["real"] * event.copies + ["tamper"] * event.tamper + ["stale"] * event.stale
        for copy, kind in enumerate(kinds):
            if kind != "real":  # refused, recorded and tallied unless the database was down
                msg_id = f"stale_{event.msg_id}" if kind == "stale" else event.msg_id
                request(msg_id, kind, copy, 1, sent, 401, REFUSAL_OF[kind])
                if not _down(sent):
                    audits.append((msg_id, REFUSAL_OF[kind], 401, REFUSAL_OF[kind], None))
                    refusals[REFUSAL_OF[kind]] += 1
                continue
            attempt = 1
            if _down(sent):  # answered 503 without a record: the database is down
                request(event.msg_id, kind, copy, attempt, sent, 503, "not_stored")
                attempt += 1
            answer = outcome[event.msg_id] if copy == 0 else "duplicate"
            status = 202 if answer == "deferred" else 200
            request(event.msg_id, kind, copy, attempt, _taken_at(sent), status, answer)
            audits.append((event.msg_id, "verified", status, answer, None))
    return rows, audits, refusals
