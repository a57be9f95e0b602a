"""What makes a source or a destination not OK: each condition a stable code (in
``webhook_status --json``; docs/watching.md lists them), its level, why it matters, and
its test. The one rule for a state: the worst condition that holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.utils.text import format_lazy
from django.utils.translation import ngettext

from ..conf import app_settings
from ..core import storable
from ..core.states import Reason, State
from ..exceptions import NotStored
from ..presentation.display import duration_text, duration_text_lazy, top_counts
from ..reconcile.models import RunOutcome
from .statuses import RECEIPTS, DestinationStatus, SourceStatus

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

# a retrying event failing for longer than this is worth a look: its cause is not passing
OLD_RETRY = timedelta(hours=1)
# How long a retry may be overdue, or a destination's due message go unanswered, before
# it is a state: not fixed, derived from the sweeps' intervals and the destination's
# limits (watch/pickup.py; SourceStatus.retry_pickup, DestinationStatus.pickup).


@dataclass(frozen=True)
class Condition:
    code: str
    state: State
    # why this condition matters, in one line (docs/watching.md lists them); lazy where
    # it holds a duration (duration_text_lazy)
    why: StrOrPromise
    # (summary, sentence) for a source's or destination's status, or None when the
    # condition does not hold
    test: Callable[[Any], tuple[str, str] | None]


def reasons(conditions: Iterable[Condition], status: Any) -> tuple[Reason, ...]:
    """Every one of ``conditions`` that holds for ``status``, in their order (alerts
    first)."""
    found = ((c, c.test(status)) for c in conditions)
    return tuple(Reason(c.code, c.state, *words) for c, words in found if words is not None)


# --- sources -------------------------------------------------------------------------------


def _source_unreadable(s: SourceStatus) -> tuple[str, str] | None:
    if not s.secrets_unreadable:
        return None
    return s.secrets_unreadable, (
        f"{s.secrets_unreadable}: every request is answered 503 (the sender retries) "
        "until the key they were encrypted with is put back, or new secrets are set"
    )


def _silent(s: SourceStatus) -> tuple[str, str] | None:
    alert = s.silence_alert
    if alert is None:
        return None
    if alert.last_accepted_at:
        silent_for = duration_text(s.now - alert.last_accepted_at)
        summary, since = f"silent for {silent_for}", f"no accepted event for {silent_for}"
    else:
        summary, since = "silent, never sent an event", "no accepted event ever"
    window = duration_text(timedelta(seconds=alert.silence_after_seconds))
    text = f"silent: {since} (window {window})"
    if alert.rejected_total:
        text += f", {alert.rejected_total} refused meanwhile ({top_counts(alert.rejected_counts)})"
    return summary, text


def _repair(s: SourceStatus) -> tuple[str, str] | None:
    n = s.open_repair_total
    if not n:
        return None
    summary = ngettext("%d open repair item", "%d open repair items", n) % n
    return summary, f"{summary} ({top_counts(s.open_repairs)})"


def _dead(s: SourceStatus) -> tuple[str, str] | None:
    if not s.dead:
        return None
    text = ngettext("%d dead letter", "%d dead letters", s.dead) % s.dead
    return text, text


def _old_retry(s: SourceStatus) -> tuple[str, str] | None:
    age = s.oldest_retry_age
    if age is None or age <= OLD_RETRY:
        return None
    return f"retrying for {duration_text(age)}", (
        f"an event has been retrying for {duration_text(age)}"
    )


def _overdue(s: SourceStatus) -> tuple[str, str] | None:
    late = s.retry_overdue
    if late is None or late <= s.retry_pickup:
        return None
    if RECEIPTS in s.unread:
        # a lock on the receipts holds every retry (each meets it and is deferred) as
        # surely as a stopped worker: say which, as far as the status could look
        return "retries held by the receipts", (
            f"no retry applied: one was due {duration_text(late)} ago, and the receipts, "
            "which every retry writes, could not be read: a lock on them holds each retry, "
            "deferred again, however the sweep runs (beat's heartbeat says whether it does)"
        )
    return "retries not running", (
        f"retries are not running: one was due {duration_text(late)} ago (a running "
        f"sweep retries it within {duration_text(s.retry_pickup)})"
    )


def _rejected(s: SourceStatus) -> tuple[str, str] | None:
    refused = {k: n for k, n in s.rejected_last_hour.items() if k != NotStored.code}
    n = sum(refused.values())
    if not n:
        return None
    summary = ngettext("%d request refused", "%d requests refused", n) % n
    text = f"{summary} in the last hour ({top_counts(refused)})"
    if s.unrecorded_last_hour:
        text += (
            f"; a flood: {s.unrecorded_last_hour} of them beyond "
            f"{app_settings().rejected_audit_per_minute} a minute per reason are counted, "
            "not recorded one by one"
        )
    return summary, text


def _not_stored(s: SourceStatus) -> tuple[str, str] | None:
    n = s.rejected_last_hour.get(NotStored.code, 0)
    if not n:
        return None
    summary = ngettext("%d request not stored (503)", "%d requests not stored (503)", n) % n
    text = ngettext(
        "%d request answered 503 (not stored) in the last hour",
        "%d requests answered 503 (not stored) in the last hour",
        n,
    )
    return summary, text % n


def _reconcile_failed(s: SourceStatus) -> tuple[str, str] | None:
    if s.last_run is None or s.last_run.outcome != RunOutcome.FAILED:
        return None
    error = " ".join(s.last_run.error.split())
    summary = "reconciliation failed"
    return summary, "the last reconciliation failed" + (f": {error[:80]}" if error else "")


# The one rule for a source's state: the worst condition that holds, ALERT first. Each
# line: a stable code (in --json), the level, and why it is that level. "Needs repair"
# is read from the open repair items rather than the last run's outcome: an item
# resolved by hand no longer needs anything, although the run that found it said so.
SOURCE_CONDITIONS: tuple[Condition, ...] = (
    Condition(
        "secrets_unreadable",
        State.ALERT,
        "no configured key decrypts the source record's secrets (a key removed before "
        "they were re-encrypted, or malformed): none of its requests can be verified, "
        "and each is answered 503",
        _source_unreadable,
    ),
    Condition(
        "silent",
        State.ALERT,
        "an open silence alert: the source sent nothing we accepted for longer than its "
        "window, within its active hours",
        _silent,
    ),
    Condition(
        "repair_needed",
        State.ALERT,
        "open repair items: reconciliation found events the sender lists and we lack, or "
        "state that differs",
        _repair,
    ),
    Condition(
        "retries_stalled",
        State.ALERT,
        "a retry overdue for longer than a running sweep leaves one (its interval, plus a "
        "batch per SWEEP_BATCH_SIZE due): the worker or beat is down, nothing is retried",
        _overdue,
    ),
    Condition(
        "dead_letters",
        State.ATTENTION,
        "dead letters: verified events that will not be retried; a person replays or discards them",
        _dead,
    ),
    Condition(
        "old_retry",
        State.ATTENTION,
        format_lazy(
            "an event retrying for over {}: its cause is not passing and it will soon be dead",
            duration_text_lazy(OLD_RETRY),
        ),
        _old_retry,
    ),
    Condition(
        "not_stored",
        State.ATTENTION,
        "verified requests answered 503 in the last hour: neither applied nor captured "
        "(the database failing); the sender retries them",
        _not_stored,
    ),
    Condition(
        "rejected",
        State.ATTENTION,
        "requests refused in the last hour: a wrong secret, clock or URL at the sender, "
        "or someone else's requests",
        _rejected,
    ),
    Condition(
        "reconcile_failed",
        State.ATTENTION,
        "the last reconciliation run failed: differences with the sender go unseen",
        _reconcile_failed,
    ),
)


# --- destinations ----------------------------------------------------------------------------


def _secrets_unreadable(d: DestinationStatus) -> tuple[str, str] | None:
    if not d.secrets_unreadable:
        return None
    return d.secrets_unreadable, (
        f"{d.secrets_unreadable}: nothing is sent to it (its messages wait) until new "
        "secrets are set, or the key they were encrypted with is put back"
    )


def _breaker_open(d: DestinationStatus) -> tuple[str, str] | None:
    if d.breaker.state != "open" or d.breaker.until is None:
        return None
    left = duration_text(d.breaker.until - d.now)
    return "breaker open", (
        f"paused after {d.breaker.consecutive_failures} consecutive failures; one probe in {left}"
    )


def _failed(d: DestinationStatus) -> tuple[str, str] | None:
    if not d.failed:
        return None
    summary = ngettext("%d message failed", "%d messages failed", d.failed) % d.failed
    return summary, f"{summary} for good, waiting for Retry now or Discard"


def _held_back(d: DestinationStatus) -> tuple[str, str] | None:
    if not d.held_back or d.first_holder is None:
        return None
    key, ordering_key = (storable.text(value, 255) for value in d.first_holder[1:])
    behind = ngettext("%d later message", "%d later messages", d.held_back) % d.held_back
    if d.holding_back == 1:
        text = f"failed message {key} holds back {behind} of its ordering key {ordering_key}"
    else:
        text = (
            f"{d.holding_back} failed messages hold back {behind} of their ordering keys "
            f"(the oldest: {key}, ordering key {ordering_key})"
        )
    return f"holding back {d.held_back}", f"{text}: Retry now or Discard it to let them go"


def _record_failing(d: DestinationStatus) -> tuple[str, str] | None:
    if not d.record_failing:
        return None
    return "answers not recorded", (
        f"the relay could not record its answers: {d.record_error} (each is sent again, "
        "under its key, when its lease runs out, and counted against its budget)"
    )


def _waiting(d: DestinationStatus) -> timedelta | None:
    """How long a message the relay would send now has been due, when that is longer
    than the relay takes to pick one up (DestinationStatus.pickup) and nothing else
    explains it; else None."""
    due = d.due_age
    if not d.enabled or d.breaker.state == "open" or due is None or due <= d.pickup:
        return None
    if d.record_failing:  # it is sending: _record_failing names the cause
        return None
    if d.secrets_unreadable:  # the relay runs, and refuses to sign: that is the cause
        return None
    return due


def _not_sending(d: DestinationStatus) -> bool:
    """Messages due past the pickup, and nothing answered for as long since a running
    relay owed an answer (DestinationStatus.owed_since)."""
    owed = d.owed_since
    return _waiting(d) is not None and (owed is None or d.now - owed > d.pickup)


def _stalled(d: DestinationStatus) -> tuple[str, str] | None:
    due = _waiting(d)
    if due is None or not _not_sending(d):
        return None
    last = d.last_attempt_at
    since = "never" if last is None else f"not for {duration_text(d.now - last)}"
    return "relay not sending", (
        f"messages due for {duration_text(due)} and no answer ({since}), where a running "
        f"relay answers within {duration_text(d.pickup)}: is a relay running (manage.py "
        "webhook_relay)?"
    )


def _behind(d: DestinationStatus) -> tuple[str, str] | None:
    due = _waiting(d)
    if due is None or _not_sending(d):
        return None
    return f"behind by {duration_text(due)}", (
        f"a message has been due for {duration_text(due)} while others are sent "
        f"({d.backlog} in the backlog; a message is picked up within "
        f"{duration_text(d.pickup)} at its limits): its limits are too low for the "
        "traffic, or it answers slowly"
    )


def _disabled_by_relay(d: DestinationStatus) -> tuple[str, str] | None:
    if not d.disabled_by_relay:
        return None
    since = "" if d.disabled_at is None else f" {duration_text(d.now - d.disabled_at)} ago"
    held = ngettext("%d message held", "%d messages held", d.backlog) % d.backlog
    return f"disabled by the relay, {held}", (
        f"disabled by the relay{since}: {d.disabled_reason}; {held} until it is enabled "
        "again (or discarded)"
    )


def _disabled(d: DestinationStatus) -> tuple[str, str] | None:
    if d.enabled or not d.backlog or d.disabled_by_relay:
        return None
    summary = f"disabled, {d.backlog} waiting"
    text = ngettext(
        "disabled with %d message waiting to be sent",
        "disabled with %d messages waiting to be sent",
        d.backlog,
    )
    return summary, text % d.backlog


# (code, level, why: docs/watching.md lists them, test). ATTENTION but one: a
# destination is someone else's endpoint, and nothing is lost while messages wait; a
# relay that sends nothing at all is ours, and ALERT (it is listed first).
DESTINATION_CONDITIONS: tuple[Condition, ...] = (
    Condition(
        "relay_not_sending",
        State.ALERT,
        "messages due, and no answer of any kind, for longer than a running relay takes "
        "to pick one up (the sweep's interval, a token of its rate, its timeout): the "
        "worker or beat is down, nothing is sent",
        _stalled,
    ),
    Condition(
        "disabled_by_relay",
        State.ATTENTION,
        "the relay disabled the destination (it answered 410 Gone, or failed with no "
        "success for DISABLE_AFTER_FAILING_DAYS): its messages are held until it is enabled",
        _disabled_by_relay,
    ),
    Condition(
        "secrets_unreadable",
        State.ATTENTION,
        "no configured key decrypts the destination's signing secrets (a key removed "
        "before they were re-encrypted): the relay sends it nothing until they are replaced",
        _secrets_unreadable,
    ),
    Condition(
        "breaker_open",
        State.ATTENTION,
        "the destination failed too often in a row and is paused until one probe succeeds",
        _breaker_open,
    ),
    Condition(
        "messages_failed",
        State.ATTENTION,
        "terminal messages (4xx, or attempts spent): an operator retries or discards them",
        _failed,
    ),
    Condition(
        "held_back",
        State.ATTENTION,
        "a failed message holds back the later messages of its ordering key, which are "
        "delivered in order: retry or discard it",
        _held_back,
    ),
    Condition(
        "record_failing",
        State.ATTENTION,
        "the relay sends, but the database refused to record the answers: they are sent "
        "again when their leases end",
        _record_failing,
    ),
    Condition(
        "behind",
        State.ATTENTION,
        "a message due for longer than the relay takes to pick one up, while others are "
        "answered: its limits are too low for the traffic, or it answers slowly",
        _behind,
    ),
    Condition(
        "disabled_with_backlog",
        State.ATTENTION,
        "a disabled destination with messages waiting: enable it, or discard them",
        _disabled,
    ),
)
