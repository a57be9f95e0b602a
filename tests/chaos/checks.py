"""The end-of-run checks: the database (read with plain SQL), the sender's record of its
requests and the merchant's book, against the plan. Each check is a ``Check`` with its
figures; any that fails makes the run exit non-zero.

- every correctly signed event applied exactly once (one receipt; as many ledger rows as
  its lines), or held as a dead letter with its reason; none still retrying;
- no tampered or stale request had an effect (no receipt, no row of an ``evil-`` order);
- ledger sums per SKU and order states exactly as the plan's events make them;
- every outbox message delivered once as the merchant's effects show, or terminal with
  its reason; one message per applied order move; an order's moves in version order,
  none past an older one that failed;
- audit records against the requests that reached the app (see ``audit_check``);
- the merchant's latency beside noisy neighbours (see ``isolation_check``).

``test_planted_defects.py`` feeds them a recorded run (``recorded.py``) with one defect
planted in it: each defect fails the check that guards against it.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import psycopg

from tests.chaos.faults import NOISY, Window
from tests.chaos.merchant import DESTINATION as MERCHANT
from tests.chaos.merchant import RETRY_AFTER_S, MerchantBook
from tests.chaos.plan import EVIL_PREFIX, PlannedEvent, expected_state

SAMPLE = 5  # ids quoted per problem

# the checks' names: the report prints them, and a planted defect names the one it breaks
INBOUND_ONCE = "inbound: every signed event applied once or dead-lettered"
HOSTILE = "inbound: no tampered or stale request had an effect"
STATE = "state: ledger sums and order states exactly as sent"
OUTBOUND_ONCE = "outbound: every message delivered once, or terminal with its reason"
AUDIT = "audit: records equal the requests that reached the app"
ISOLATION = "outbound: the merchant beside noisy neighbours within 2x its p99, or 1 s more"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    figures: dict = field(default_factory=dict)
    # False: report-only, shown as pending when it fails (a claim whose fix lands apart)
    required: bool = True


def passed(checks: list[Check]) -> bool:
    """Every required check held."""
    return all(check.ok or not check.required for check in checks)


@dataclass
class Requests:
    """The sender's requests, from ``requests.jsonl``."""

    rows: list[list]  # msg_id, kind, copy, attempt, t0, t1, status, answer, error
    gave_up: list[str]
    open: int


# the outbox's messages (m) with their destination (d)
_OUTBOX_OF = (
    "webhook_receiver_outboxmessage m JOIN webhook_receiver_webhookdestination d "
    "ON d.id = m.destination_id"
)


def _rows(conn: psycopg.Connection, query: str, params=()) -> list[tuple]:
    return conn.execute(query, params).fetchall()


def database_state(dsn: str, destination: str = MERCHANT) -> dict:
    """What the run left, read with plain SQL. The outbox's figures are the run's
    merchant's (``destination``): its messages (``outbox``) and when each was admitted
    (``admitted``, epoch seconds); the other destinations' messages are counted by
    status apart (``neighbours``), for no check holds them."""
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        conn.execute("SET statement_timeout = '60s'")
        mine = _rows(conn, "SELECT m.key, m.status, m.origin_event_key, m.last_error, "
                     "m.attempts, EXTRACT(EPOCH FROM m.created_at)::float8 "
                     f"FROM {_OUTBOX_OF} WHERE d.name = %s", (destination,))  # fmt: skip
        neighbours: dict[str, dict[str, int]] = defaultdict(dict)
        for name, status, count in _rows(
            conn, f"SELECT d.name, m.status, count(*) FROM {_OUTBOX_OF} WHERE d.name <> %s "
            "GROUP BY d.name, m.status", (destination,),
        ):  # fmt: skip
            neighbours[name][status] = count
        return {
            "receipts": dict(_rows(conn, "SELECT event_key, status FROM "
                                   "webhook_receiver_webhookreceipt WHERE source = 'shop'")),
            "failed": {k: (s, c, m) for k, s, c, m in _rows(
                conn, "SELECT event_key, status, last_error_class, last_error_message "
                "FROM webhook_receiver_failedevent WHERE source = 'shop'")},
            "ledger_rows": dict(_rows(conn, "SELECT event_key, count(*) FROM "
                                      "shop_inventoryledgerentry GROUP BY event_key")),
            "ledger_sums": {k: int(v) for k, v in _rows(
                conn, "SELECT sku, sum(delta) FROM shop_inventoryledgerentry GROUP BY sku")},
            "evil_ledger": [r[0] for r in _rows(
                conn, "SELECT DISTINCT order_id FROM shop_inventoryledgerentry "
                "WHERE order_id LIKE %s", (EVIL_PREFIX + "%",))],
            "orders": {o: (s, v) for o, s, v in _rows(
                conn, "SELECT order_id, status, version FROM shop_orderstate")},
            # the run's merchant's messages only: a neighbour's carry the same keys
            "outbox": {k: (s, o, e, a) for k, s, o, e, a, _ in mine},
            "admitted": {k: float(at) for k, _, _, _, _, at in mine},
            "neighbours": dict(neighbours),
            "audits": _rows(conn, "SELECT message_id, verification, response_status, result, "
                            "received_at FROM webhook_receiver_requestaudit"),
            "tallies": _rows(conn, "SELECT reason, sum(requests), sum(unrecorded) FROM "
                             "webhook_receiver_rejectiontally GROUP BY reason"),
        }  # fmt: skip


def settled(dsn: str) -> tuple[int, int]:
    """(failed events still retrying, outbox messages pending or sending to an enabled
    destination: a disabled one's are never sent, and wait for no drain)."""
    with psycopg.connect(dsn, connect_timeout=5) as conn:
        conn.execute("SET statement_timeout = '10s'")
        retrying = conn.execute(
            "SELECT count(*) FROM webhook_receiver_failedevent WHERE status = 'retrying'"
        ).fetchone()[0]
        open_ = conn.execute(
            f"SELECT count(*) FROM {_OUTBOX_OF} "
            "WHERE d.enabled AND m.status IN ('pending', 'sending')"
        ).fetchone()[0]
    return retrying, open_


def _sample(ids) -> str:
    ids = sorted(ids)
    return ", ".join(ids[:SAMPLE]) + (f" (+{len(ids) - SAMPLE})" if len(ids) > SAMPLE else "")


def every_check(
    planned: list[PlannedEvent],
    state: dict,
    requests: Requests,
    book: MerchantBook,
    outages: list[tuple[float, float]],
    windows: list[Window],
) -> list[Check]:
    """Every end-of-run check, in the report's order."""
    results = inbound_checks(planned, state, requests)
    results += outbound_checks(planned, state, book)
    results.append(audit_check(requests, state, outages))
    results.append(isolation_check(state, book, windows))
    return results


def inbound_checks(planned: list[PlannedEvent], state: dict, requests: Requests) -> list[Check]:
    receipts, failed, ledger_rows = state["receipts"], state["failed"], state["ledger_rows"]
    planned_ids = {e.msg_id for e in planned}
    # the last answer the sender got for each event: an event with neither a receipt nor
    # a failed event that was answered (202 deferred, dead_lettered) reached the app
    last_answer = {msg_id: f"{status} {answer}".strip()
                   for msg_id, kind, _, _, _, _, status, answer, _ in requests.rows
                   if kind == "real" and status is not None}  # fmt: skip
    outcomes: Counter = Counter()
    dead, lost, doubled = {}, [], []
    for event in planned:
        key = event.msg_id
        rows = ledger_rows.get(key, 0)
        if key in receipts:
            outcomes[receipts[key]] += 1
            want = len(event.lines) if event.type.startswith("inventory.") else 0
            if rows != want:
                doubled.append(f"{key} ({rows} ledger rows, {want} lines)")
        elif failed.get(key, ("",))[0] == "dead":
            dead[key] = f"{failed[key][1]}: {failed[key][2]}"[:200]
            outcomes["dead_letter"] += 1
            if rows:
                doubled.append(f"{key} (dead with {rows} ledger rows)")
        elif key in failed:
            lost.append(f"{key} ({failed[key][0]})")
        elif key in last_answer:
            lost.append(f"{key} (no receipt nor failed event, though answered {last_answer[key]})")
        else:
            lost.append(f"{key} (never received)")
    failed_by_status = Counter(s for s, _, _ in failed.values())
    checks = [
        Check(
            INBOUND_ONCE,
            not lost and not doubled and not requests.gave_up,
            f"{len(planned)} events: "
            + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items()))
            + (f"; NOT APPLIED {len(lost)}: {_sample(lost)}" if lost else "")
            + (f"; DOUBLE EFFECT {len(doubled)}: {_sample(doubled)}" if doubled else "")
            + (f"; sender gave up on {len(requests.gave_up)}" if requests.gave_up else "")
            + (f"; dead letters: {_sample(f'{k}: {v}' for k, v in dead.items())}" if dead else "")
            + f"; failed events by status: {dict(failed_by_status)}",
            {
                "outcomes": dict(outcomes),
                "lost": len(lost),
                "double": len(doubled),
                "dead": dead,
                "failed_events": dict(failed_by_status),
            },
        )  # fmt: skip
    ]
    stale_ids = {f"stale_{e.msg_id}" for e in planned if e.stale}
    stray = (set(receipts) | set(failed)) - planned_ids
    evil_rows = [k for k in state["orders"] if k.startswith(EVIL_PREFIX)]
    evil_rows += state["evil_ledger"]
    answers = Counter(
        (kind, status, answer) for _, kind, _, _, _, _, status, answer, _ in requests.rows
        if kind != "real"
    )  # fmt: skip
    wrong = {k: n for k, n in answers.items() if k[1] not in (401, None)}
    checks.append(
        Check(
            HOSTILE,
            not stray and not evil_rows and not wrong,
            f"{sum(e.tamper for e in planned)} tampered, {len(stale_ids)} stale; answers "
            + ", ".join(f"{k[0]} {k[1]} {k[2]}: {n}" for k, n in sorted(answers.items(), key=str))
            + (f"; STRAY RECEIPTS {_sample(stray)}" if stray else "")
            + (f"; EVIL ROWS {_sample(evil_rows)}" if evil_rows else "")
            + (f"; ACCEPTED {wrong}" if wrong else ""),
        )
    )
    sums, orders = expected_state(planned, excluded=set(dead))
    got_sums = {k: v for k, v in state["ledger_sums"].items() if v or k in sums}
    bad_skus = {s for s in set(sums) | set(got_sums) if sums.get(s) != got_sums.get(s)}
    got_orders = state["orders"]
    bad_orders = {o for o in set(orders) | set(got_orders) if orders.get(o) != got_orders.get(o)}
    checks.append(
        Check(
            STATE,
            not bad_skus and not bad_orders,
            f"{len(sums)} SKUs, {len(orders)} orders"
            + (
                "; SKUS "
                + "; ".join(
                    f"{s} want {sums.get(s)} got {got_sums.get(s)}"
                    for s in sorted(bad_skus)[:SAMPLE]
                )
                if bad_skus
                else ""
            )
            + (
                "; ORDERS "
                + "; ".join(
                    f"{o} want {orders.get(o)} got {got_orders.get(o)}"
                    for o in sorted(bad_orders)[:SAMPLE]
                )
                if bad_orders
                else ""
            ),
        )  # fmt: skip
    )
    return checks


def outbound_checks(planned: list[PlannedEvent], state: dict, book) -> list[Check]:
    outbox, receipts = state["outbox"], state["receipts"]
    by_status = Counter(s for s, _, _, _ in outbox.values())
    unsettled = [k for k, (s, *_) in outbox.items() if s in ("pending", "sending")]
    undelivered = [k for k, (s, *_) in outbox.items() if s == "delivered" and k not in book.effects]
    orphan = [k for k in book.effects if k not in outbox]
    terminal = {k: f"{s}: {e}"[:160] for k, (s, _, e, _) in outbox.items()
                if s in ("failed", "discarded")}  # fmt: skip
    # one message per applied order move, none for a stale one
    origins = Counter(o for _, o, _, _ in outbox.values())
    moves = {e.msg_id for e in planned if e.type.startswith("order.")}
    missing = [k for k in moves if receipts.get(k) == "applied" and origins[k] != 1]
    extra = [k for k in moves if receipts.get(k) != "applied" and origins[k]]
    # an order's moves reach the merchant in version order, and its last is the state's
    seen: dict[str, list[int]] = defaultdict(list)
    for key in book.order:
        effect = book.effects[key]
        seen[effect.order_id].append(effect.version)
    disorder = [
        f"{o} (arrived v{', v'.join(map(str, v))})"
        for o, v in seen.items()
        if v != sorted(v) or len(set(v)) != len(v)
    ]
    # a failed message holds its ordering key for an operator: a newer move of its order
    # that reached the merchant went past it (the arrival order alone cannot show it)
    planned_by_id = {e.msg_id: e for e in planned}
    for status, origin, _, _ in outbox.values():
        event = planned_by_id.get(origin)
        if status != "failed" or event is None:
            continue
        newer = [v for v in seen.get(event.order_id, []) if v > event.version]
        if newer:
            disorder.append(
                f"{event.order_id} (v{newer[0]} delivered past v{event.version}, failed)"
            )
    behind = [o for o, v in seen.items() if state["orders"].get(o, ("", -1))[1] != v[-1]]
    redelivered = sum(1 for n in book.deliveries.values() if n > 1)
    ok = not (unsettled or undelivered or orphan or missing or extra or disorder or behind)
    detail = (
        f"{len(outbox)} messages: {dict(by_status)}; merchant effects {len(book.effects)}, "
        f"answers {dict(book.answers)}, keys delivered more than once {redelivered}"
    )
    for label, ids in (("STILL OPEN", unsettled), ("DELIVERED WITHOUT EFFECT", undelivered),
                       ("EFFECT WITHOUT MESSAGE", orphan), ("MOVE WITHOUT ONE MESSAGE", missing),
                       ("MESSAGE FOR A STALE MOVE", extra), ("OUT OF ORDER", disorder),
                       ("MERCHANT BEHIND THE STATE", behind)):  # fmt: skip
        if ids:
            detail += f"; {label} {len(ids)}: {_sample(ids)}"
    if terminal:
        detail += f"; terminal: {_sample(f'{k} ({v})' for k, v in terminal.items())}"
    if state.get("neighbours"):  # the noisy neighbours': pending or failed, by design
        detail += f"; other destinations' messages, not held to this: {state['neighbours']}"
    figures = {"by_status": dict(by_status), "effects": len(book.effects),
               "answers": dict(book.answers), "redelivered_keys": redelivered,
               "terminal": terminal}  # fmt: skip
    return [Check(OUTBOUND_ONCE, ok, detail, figures)]


# PostgreSQL's WAL writer flushes a commit that did not wait within 3 x wal_writer_delay
# (200 ms by default): a crash may lose what was answered that long before it, and a
# little more for the sender's clock to read the answer.
RELAXED_COMMIT_SECONDS = 1.0


def audit_check(requests: Requests, state: dict, outages: list[tuple[float, float]]) -> Check:
    """Audit records against requests. A request the sender got an answer for reached
    the app: a 200 or 202 must have exactly one verified record; a 503 has one when the
    database took it (not while it was down). A request without an answer may or may
    not have reached it (0 or 1 record); one that found no connection never did (none).
    Refusals are counted in their minute's tally, records + unrecorded = requests; the
    tally misses only refusals answered while the database was down.

    A refusal's record is committed without waiting for its WAL flush
    (docs/security.md): a crash (``postgres_stop`` is ``-m immediate``) may lose those
    answered within the WAL writer's delay before it. ``outages`` start
    RELAXED_COMMIT_SECONDS before each crash for that reason. A verified request's
    record, a duplicate's included, is committed durably: never lost."""
    answered: dict[str, Counter] = defaultdict(Counter)
    ambiguous: Counter = Counter()
    statuses: Counter = Counter()
    refused = no_answer = 0
    refusals: Counter = Counter()  # 401 answers by reason
    refusals_in_outage: Counter = Counter()
    for msg_id, kind, _, _, t0, _, status, answer, error in requests.rows:
        if status is not None:
            statuses[status] += 1
            if kind == "real":
                answered[msg_id]["2xx" if 200 <= status < 300 else str(status)] += 1
            elif status == 401:
                refusals[answer] += 1
                if any(a <= t0 <= b for a, b in outages):
                    refusals_in_outage[answer] += 1
        elif error.startswith("refused"):
            refused += 1
        else:
            no_answer += 1
            ambiguous[msg_id] += 1
    audited: dict[str, Counter] = defaultdict(Counter)
    rejected_audits: Counter = Counter()
    for msg_id, verification, status, _, _ in state["audits"]:
        if verification == "verified":
            audited[msg_id]["2xx" if 200 <= status < 300 else str(status)] += 1
        else:
            rejected_audits[verification] += 1
    problems = []
    for msg_id in set(answered) | set(audited):
        a, v, amb = answered[msg_id], audited[msg_id], ambiguous[msg_id]
        if not a["2xx"] <= v["2xx"] <= a["2xx"] + amb:
            problems.append(f"{msg_id}: {a['2xx']} answered 2xx, {v['2xx']} records")
        elif v["503"] > a["503"] + amb or sum(v.values()) > sum(a.values()) + amb:
            problems.append(f"{msg_id}: records {dict(v)} for answers {dict(a)} (+{amb})")
    tally_problems = []
    tallied = {reason: (int(r), int(u)) for reason, r, u in state["tallies"]}
    for reason, (total, unrecorded) in tallied.items():
        if rejected_audits[reason] + unrecorded != total:
            tally_problems.append(f"{reason}: {rejected_audits[reason]} + {unrecorded} != {total}")
    for reason in set(tallied) | set(refusals):
        total = tallied.get(reason, (0, 0))[0]
        if not refusals[reason] - refusals_in_outage[reason] <= total <= refusals[reason]:
            tally_problems.append(f"{reason}: {refusals[reason]} answered, {total} tallied")
    a2 = sum(c["2xx"] for c in answered.values())
    v2 = sum(c["2xx"] for c in audited.values())
    a503 = sum(c["503"] for c in answered.values())
    v503 = sum(c["503"] for c in audited.values())
    figures = {
        "requests": len(requests.rows), "answered_by_status": dict(statuses),
        "no_connection": refused, "no_answer": no_answer,
        "verified_2xx_answered": a2, "verified_2xx_records": v2,
        "answered_503": a503, "records_503": v503,
        "refusals_answered": dict(refusals), "refusals_tallied": tallied,
        "refusal_records": dict(rejected_audits),
    }  # fmt: skip
    detail = (
        f"{len(requests.rows)} requests: answered {dict(sorted(statuses.items()))}, "
        f"{refused} found no connection (never reached the app: no record), {no_answer} "
        f"got no answer (0 or 1 record each); 2xx answered {a2}, records {v2} (the "
        f"difference: unanswered requests the app did record); 503 answered {a503}, "
        f"recorded {v503} (the rest answered while the database was down); refusals "
        f"answered {dict(refusals)}, tallied {tallied} (records + unrecorded = requests)"
    )
    if problems:
        detail += f"; MISMATCH {len(problems)}: {_sample(problems)}"
    if tally_problems:
        detail += f"; TALLY MISMATCH: {'; '.join(tally_problems)}"
    return Check(AUDIT, not problems and not tally_problems, detail, figures)


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def merchant_latencies(state: dict, book: MerchantBook) -> list[tuple[float, float]]:
    """(admitted at, seconds to its first arrival at the merchant) per message of the
    merchant's, ``inf`` for one that never arrived. Both are this machine's wall clock:
    the app's at admission (``created_at``, in the transaction that admits it), the
    merchant's when the head of the message's first request was read."""
    arrivals = book.arrivals
    return [
        (at, arrivals[key] - at if key in arrivals else math.inf)
        for key, at in state.get("admitted", {}).items()
    ]


def latency_figures(latencies: list[float]) -> dict:
    """Count, p50, p99 and max in seconds (``None`` without any), and how many never
    arrived (counted in the percentiles as never: ``inf``)."""
    finite = [x for x in latencies if x != math.inf]
    return {
        "messages": len(latencies),
        "p50_s": _seconds(percentile(latencies, 0.5)),
        "p99_s": _seconds(percentile(latencies, 0.99)),
        "max_s": _seconds(max(finite)) if finite else None,
        "never_arrived": len(latencies) - len(finite),
    }


def _seconds(value: float | None) -> float | None:
    return None if value is None or value == math.inf else round(value, 3)


def isolation_check(state: dict, book: MerchantBook, windows: list[Window]) -> Check:
    """The isolation claim of docs/sending.md (the relay's lanes): a healthy destination's latency,
    admission to first arrival, with noisy neighbours beside it is within twice its
    figure alone, or a second more: the p99 of the merchant's messages admitted while
    every neighbour was subscribed (the fault's hold) against the p99 of those admitted
    before the first fault began: after one, a backlog it left (a frozen relay's, a
    broker outage's) would loosen the bound. A message that never arrived counts as
    never. A 429 the merchant itself answered in the hold adds the wait it asked for
    (Retry-After): the message behind it in its order waits that long, by the
    merchant's wish, not its neighbours' doing."""
    noisy = next((w for w in windows if w.name == NOISY), None)
    if noisy is None or noisy.hold is None:
        return Check(ISOLATION, False, f"no {NOISY} window held: nothing measured")
    start, end = noisy.hold
    latencies = merchant_latencies(state, book)
    beside_values = [x for at, x in latencies if start <= at <= end]
    first = min(w.start for w in windows)
    calm_values = [x for at, x in latencies if at < first]
    beside, calm = latency_figures(beside_values), latency_figures(calm_values)
    beside_p99, calm_p99 = percentile(beside_values, 0.99), percentile(calm_values, 0.99)
    asked = sum(1 for at in book.deferred_at if start <= at <= end)
    asked_s = RETRY_AFTER_S if asked else 0
    bound = None if calm_p99 is None else max(2 * calm_p99, calm_p99 + 1.0) + asked_s
    ok = beside_p99 is not None and bound is not None and beside_p99 <= bound
    detail = (
        f"merchant p99 {_said(beside_p99)} admitted beside the neighbours "
        f"({beside['messages']} messages, max {_said(beside['max_s'])}) against "
        f"{_said(calm_p99)} before the first fault ({calm['messages']} messages); bound "
        f"max(2 x {_said(calm_p99)}, {_said(calm_p99)} + 1 s)"
    )
    if asked:
        detail += f" + {asked_s} s the merchant asked for (429 answered {asked} x in the hold)"
    detail += f" = {_said(bound)}"
    if beside_p99 is None or calm_p99 is None:
        detail += "; NOTHING TO COMPARE: no message admitted " + (
            "beside the neighbours" if beside_p99 is None else "before the first fault"
        )
    elif not ok:
        detail += f"; OVER THE BOUND by {_said(beside_p99 - bound)}"
    never = beside["never_arrived"] + calm["never_arrived"]
    if never:
        detail += f"; {never} never arrived"
    detail += f"; {noisy.detail}"
    figures = {"beside": beside, "calm": calm, "bound_s": _seconds(bound),
               "hold": [start, end], "neighbours": noisy.detail}  # fmt: skip
    return Check(ISOLATION, ok, detail, figures)


def _said(seconds: float | None) -> str:
    if seconds is None:
        return "none"
    return "never" if seconds == math.inf else f"{seconds:.2f} s"
