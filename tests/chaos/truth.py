"""Did status and health tell the truth? The watcher's probes (``watcher.py``) set beside
the faults' windows: per fault and per probe (``health``, ``status``), when it first said
something was wrong, when it said OK again, and whether it said OK during the fault.
Pure data in, a table out: ``test_truth.py`` feeds it probes of its own.

For a fault that began at B and ended at E (the next one beginning at N), judged against
what the probe said last before B (``before``: ``ok``, ``wrong``, ``None`` without an
answer; ``before_reasons``): an answer *says the fault* when it names a reason it did
not name then (a probe still wrong from the last fault has not noticed this one by
repeating it), and *says it is over* when it is OK, or names no reason but those.

- ``first_wrong_s``: seconds from B to the first answer that says the fault, of a probe
  asked before min(E + 60 s, N) and answered after B and before N; ``None`` when there
  was none.
- ``ok_again_s``: seconds from E to the first answer that says it is over after the last
  that said the fault, of the probes asked before E + 60 s: once it has said the fault,
  an answer says it is over when it names none of the fault's own reasons (those first
  named during it), whatever the next fault adds; negative when before the fault was
  over; ``None`` when it never said the fault, or still said it a minute after.
- ``ok_during``: answers that say it is over, asked and answered within the fault after
  it had said it (or, when it never did, after its 60 s to notice).
- ``answers``: the probes asked in the fault, by answer (ok, wrong, none).
- ``unanswered``: probes asked in B to min(E + 60 s, N) with no answer within bound.

``HELD`` says which probes must notice which fault (docs/testing.md, "The fault run",
gives the reasons); ``truth_check`` holds them to it: noticed within 60 s of B, OK again within 60
s of E, never OK during it, and every probe of every fault answered within its bound.
"""

from __future__ import annotations

from tests.chaos.checks import Check
from tests.chaos.faults import BROKER, FROZEN, NOISY, Window
from tests.chaos.watcher import HEALTH, STATUS, Probe

WITHIN = 60.0  # seconds: to say a fault began, and that it is over
TRUTHFUL = (
    "status and health: each fault said within 60 s, over within 60 s of its end, "
    "never OK during it"
)
# which probe must say something is wrong, per fault; the rest are shown, not held
HELD: dict[str, tuple[str, ...]] = {
    NOISY: (STATUS,),  # six destinations failing or never answering
    FROZEN: (HEALTH, STATUS),  # nothing relayed, no relay's heartbeat
    "postgres_stop": (HEALTH, STATUS),
    BROKER: (HEALTH, STATUS),
    "lock_receipts": (HEALTH, STATUS),  # receipts unreadable: nothing can be received
    "lock_outbox": (STATUS,),  # the destinations' backlog unreadable, nothing relayed
}


def truth_table(probes: list[Probe], windows: list[Window]) -> list[dict]:
    """A row per fault, in the order they ran, with a figure set per probe kind."""
    ordered = sorted(windows, key=lambda w: w.start)
    rows = []
    for n, window in enumerate(ordered):
        following = ordered[n + 1].start if n + 1 < len(ordered) else float("inf")
        row: dict = {"fault": window.name, "began": window.start, "ended": window.end}
        for kind in (HEALTH, STATUS):
            mine = sorted((p for p in probes if p.kind == kind), key=lambda p: p.start)
            row[kind] = _figures(mine, window, following)
            row[kind]["held"] = kind in HELD.get(window.name, ())
        rows.append(row)
    return rows


def _figures(probes: list[Probe], window: Window, following: float) -> dict:
    began, ended = window.start, window.end
    notice_until = min(ended + WITHIN, following)
    answered_before = [p for p in probes if p.end <= began and p.ok is not None]
    last = answered_before[-1] if answered_before else None
    before = None if last is None else "ok" if last.ok else "wrong"
    known = set(last.reasons) if last else set()

    def says_fault(p: Probe) -> bool:
        return p.ok is False and bool(set(p.reasons) - known)

    # answered before the next fault began: a later answer may be that fault's
    first_wrong = next((p for p in probes if says_fault(p) and began < p.end <= following
                        and p.start < notice_until), None)  # fmt: skip
    # this fault's own reasons: those said new from its start to its end (or its first)
    own: set[str] = set()
    if first_wrong is not None:
        until = max(ended, first_wrong.end)
        own = {r for p in probes if says_fault(p) and began < p.end <= until
               for r in set(p.reasons) - known}  # fmt: skip

    def says_over(p: Probe) -> bool:
        if own:  # the next fault's reasons do not keep this one open
            return p.ok is not None and not set(p.reasons) & own
        return p.ok is not None and set(p.reasons) <= known

    ok_again = None
    if first_wrong is not None:
        after = [p for p in probes if first_wrong.start <= p.start < ended + WITHIN]
        # the last that said it while it lasted (or the first, said after its end)
        last_wrong = max(
            i for i, p in enumerate(after) if set(p.reasons) & own and (i == 0 or p.start < ended)
        )
        ok_again = next((p for p in after[last_wrong:] if says_over(p)), None)
    said_from = first_wrong.end if first_wrong else began + WITHIN
    ok_during = [p for p in probes if says_over(p) and p.start >= said_from and p.end <= ended]
    asked = [p for p in probes if began <= p.start < ended]
    return {
        "before": before,
        "before_reasons": sorted(known),
        "first_wrong_s": _since(first_wrong.end, began) if first_wrong else None,
        "first_wrong_said": first_wrong.said if first_wrong else None,
        "ok_again_s": _since(ok_again.end, ended) if ok_again else None,
        "ok_during": len(ok_during),
        "answers": {
            "ok": sum(p.ok is True for p in asked),
            "wrong": sum(p.ok is False for p in asked),
            "none": sum(p.ok is None for p in asked),
        },
        "unanswered": sum(p.ok is None and began <= p.start < notice_until for p in probes),
    }


def _since(at: float, origin: float) -> float:
    return round(at - origin, 1)


def truth_check(table: list[dict], required: bool) -> Check:
    """The table held to ``HELD``; ``required`` False (no ``--require-truthful-status``):
    shown as pending, it does not fail the run."""
    problems = []
    for row in table:
        for kind in (HEALTH, STATUS):
            f = row[kind]
            where = f"{row['fault']} {kind}"
            if f["unanswered"]:
                problems.append(f"{where}: {f['unanswered']} probes unanswered within bound")
            if not f["held"]:
                continue
            first, again = f["first_wrong_s"], f["ok_again_s"]
            if first is None:
                problems.append(f"{where}: never said wrong")
            elif first > WITHIN:
                problems.append(f"{where}: said wrong only after {first:g} s")
            elif again is None:
                problems.append(f"{where}: not OK again before the next fault")
            elif again > WITHIN:
                problems.append(f"{where}: OK again only {again:g} s after the end")
            if f["ok_during"]:
                problems.append(f"{where}: said OK {f['ok_during']} times during the fault")
    held = sum(len(HELD.get(row["fault"], ())) for row in table)
    detail = f"{len(table)} faults, {held} (fault, probe) pairs held"
    detail += f"; {len(problems)} wrong: {'; '.join(problems)}" if problems else "; all true"
    if not required:
        detail += " (report-only: --require-truthful-status makes it fail the run)"
    return Check(TRUTHFUL, not problems, detail, {"rows": len(table)}, required=required)
