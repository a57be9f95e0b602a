"""Recovery jobs in a run (outbound/recovery.py says what a job is): a destination's
``recovery`` makes an operator start one at its time, through ``recovery_start`` (scope
every tenant, by "ops"), and the run's relays step the running jobs every STEP_SECONDS
on the simulated clock, as ``manage.py webhook_relay`` does. Each start is recorded in
the observations (``Observations.recoveries``: when, the job, what it planned, its pace,
or why it was refused), and at the cut-off what the job did (its state, what it
released). ``recovery-within-rate`` holds each job to its own pace and to its plan.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from ..outbound.models import RecoveryJob, WebhookDestination
from ..outbound.recovery import Criteria, RecoveryRefused, recovery_start
from ..outbound.recovery_run import RELEASED_AHEAD_SECONDS, STEP_SECONDS
from ..outbound.tenancy import EVERY_TENANT
from .answers import SUCCESSES
from .bounds import MAX_BEAT_TICKS, MAX_ENTRIES
from .observed import Observations, RunView, invariant, over_rate, when
from .reading import refusal

if TYPE_CHECKING:
    from .inputs import Scenario

# who starts a run's recovery jobs (recovery_start's ``by``)
OPERATOR = "ops"


def wanted(scenario: Scenario) -> bool:
    """Whether the run's relays step recovery jobs: only when one is asked for, so that
    every other run takes exactly the work it took before."""
    return any(d.recovery is not None for d in scenario.destinations)


def happenings(scenario: Scenario) -> list[tuple[float, str, Any]]:
    return [
        (d.recovery.at, "recover", d.name) for d in scenario.destinations if d.recovery is not None
    ]


def start(obs: Observations, dest: WebhookDestination, began: datetime) -> None:
    """The operator starts the destination's recovery job now (on the run's thread):
    recorded with what it planned, or why it was refused."""
    spec = next(d.recovery for d in obs.scenario.destinations if d.name == dest.name)
    assert spec is not None
    now = timezone.now()
    criteria = Criteria(
        kind=spec.kind,
        since=began + timedelta(seconds=spec.since),
        until=None if spec.until is None else began + timedelta(seconds=spec.until),
        event_types=tuple(f"order.{e}" for e in spec.events),
        answer_classes=spec.answers,
    )
    entry: dict[str, Any] = {
        "at": _offset(now, began),
        "destination": dest.name,
        "kind": spec.kind,
        "job": None,
        "planned": 0,
        "rate": spec.rate,
        "refused": "",
        "state": "",
        "released": 0,
        "finished": None,
    }
    try:
        job = recovery_start(
            scope=EVERY_TENANT, destination=dest, criteria=criteria, by=OPERATOR, rate=spec.rate
        )
    except RecoveryRefused as exc:
        entry["refused"] = str(exc)
    else:
        entry.update(job=job.pk, planned=job.planned, rate=job.rate, state=str(job.state))
    obs.recoveries.append(entry)


def collect(obs: Observations, began: datetime) -> None:
    """What each job did by the cut-off: its state, what it released, when it ended."""
    for entry in obs.recoveries:
        if entry["job"] is None:
            continue
        job = RecoveryJob.objects.get(pk=entry["job"])
        finished = None if job.finished_at is None else _offset(job.finished_at, began)
        entry.update(state=str(job.state), released=job.released, finished=finished)


def check_recoveries(scenario: Scenario) -> None:
    """A recovery starts within the run; the steps it makes each relay take count with
    the polls and beat's ticks (bounds.py: MAX_BEAT_TICKS)."""
    s = scenario
    for i, d in enumerate(s.destinations):
        if d.recovery is None:
            continue
        if d.recovery.at >= s.duration:
            raise refusal(
                f"destinations[{i}].recovery.at",
                f"{when(d.recovery.at)} is past the run's end ({when(s.duration)})",
            )
        if len(d.recovery.events) > MAX_ENTRIES:
            raise refusal(
                f"destinations[{i}].recovery.events",
                f"{len(d.recovery.events):,} entries; a list takes at most {MAX_ENTRIES:,}",
            )
    if not wanted(s):
        return
    steps = (s.duration / STEP_SECONDS + 1) * s.relay.processes
    ticks = steps + (s.duration / s.relay.poll + 1) * s.relay.processes
    if s.inbound is not None:
        ticks += s.duration / s.beat.retry_sweep + s.duration / s.beat.silence_check + 2
    if ticks > MAX_BEAT_TICKS:
        i = next(i for i, d in enumerate(s.destinations) if d.recovery is not None)
        raise refusal(
            f"destinations[{i}].recovery",
            f"each relay process steps the recovery jobs every {STEP_SECONDS:g} s: "
            f"{int(steps):,} steps, {int(ticks):,} ticks in all with the polls and beat's "
            f"tasks; a run takes at most {MAX_BEAT_TICKS:,}: give the run a shorter "
            "duration, or fewer relay processes",
        )


@invariant(
    "recovery-within-rate",
    "a recovery job keeps its own pace, and every message it planned is sent and delivered",
)
def recovery_within_rate(v: RunView) -> tuple[int, str]:
    """Counted at the merchant, for each job: the first arrivals, after the job started,
    of the messages it released, in any span of W seconds, are at most rate × W + 2 ×
    ahead, ahead being ceil(rate × 2 s) (RELEASED_AHEAD_SECONDS): a step releases from a
    credit of at most ahead (rate × W more over the span), and only while fewer than
    ahead of its messages wait, so at most ahead released before the span are still
    unsent at its start. And the job did what it planned: done by the cut-off, planned
    = released = the messages that name it, each delivered after the job started. A
    recovery the service refused breaks it, with the service's reason."""
    count = 0
    for job in v.obs.recoveries:
        name, number = job["destination"], job["job"]
        if number is None:
            return count, f"{name}: the recovery asked at {when(job['at'])} was refused: " + (
                job["refused"]
            )
        count += 1
        mine = [m for m in v.by_dest[name] if m.get("recovery_id") == number]
        what = f"{name}: recovery #{number} (started {when(job['at'])})"
        if job["state"] != "done" or not job["planned"] == job["released"] == len(mine):
            return count, (
                f"{what} planned {job['planned']}, released {job['released']} "
                f"({len(mine)} messages name it); {job['state']} at the cut-off"
            )
        firsts = []
        for m in mine:
            sent = [a for a in v.arrivals_of[(name, m["key"])] if a.at >= job["at"] - 1e-6]
            if m["status"] != "delivered" or not any(a.outcome in SUCCESSES for a in sent):
                return count, f"{what}: released {m['key']}, {m['status']} at the cut-off"
            firsts.append(sent[0].at)
        rate = job["rate"]
        ahead = max(1, math.ceil(rate * RELEASED_AHEAD_SECONDS))
        allowance = 2 * ahead
        times = sorted(firsts)
        looked, breach = over_rate(times, rate, allowance)
        count += looked
        if breach is not None:
            first, last = breach
            span = times[last] - times[first]
            return count, (
                f"{what}: {last - first + 1} of its messages first arrived from "
                f"{when(times[first])} to {when(times[last])} ({span:g} s), above {rate:g}/s "
                f"× {span:g} s plus 2 × {ahead} ahead ({rate * span + allowance:g})"
            )
    return count, ""


def _offset(moment: datetime, began: datetime) -> float:
    return round((moment - began).total_seconds(), 6)
