"""A scenario: the frozen inputs of one evaluation, read from a YAML or JSON file and
checked, with an error that names the file, the place and what to write instead.

The format is documented in docs/eval.md; the built-in scenarios (``scenarios/``) are
examples of every key. Durations are seconds or text (``90s``, ``5m``, ``1h30m``); rates
are ``count/duration`` (``5/s``, ``300/1m``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .bounds import check_work
from .inputs import (
    BUILT_IN,
    DEFAULT_START,
    MAX_DURATION,
    MAX_RELAYS,
    Admissions,
    Beat,
    Crash,
    Destination,
    Fault,
    Inbound,
    Recovery,
    Relay,
    Repeat,
    Scenario,
    Window,
)
from .reading import Reader, ScenarioError, read_document

# --- reading ------------------------------------------------------------------------------


def built_in_names() -> list[str]:
    return sorted(p.stem for p in BUILT_IN.glob("*.yaml"))


def load(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a scenario file (.yaml, .yml, .json)."""
    path = Path(name_or_path)
    if not path.exists():
        built_in = BUILT_IN / f"{name_or_path}.yaml"
        if not built_in.exists():
            raise ScenarioError(
                f"{name_or_path}: no such file, and no built-in scenario of that name "
                f"(built in: {', '.join(built_in_names())})"
            )
        path = built_in
    # read within bounds (size, depth, no aliases): anything else is a ScenarioError
    data = read_document(path)
    return parse(data, where=path.name, path=str(path))


def parse(data: Any, *, where: str = "scenario", path: str = "") -> Scenario:
    r = Reader(where)
    top = r.mapping(data, "")
    if "workers" in top:
        raise r.error(
            "workers",
            "the relay is a process of its own since 0.2, and beat's tasks take no simulated "
            "time: say relay: {processes: …}",
        )
    r.known(
        top,
        "",
        {
            "name",
            "description",
            "duration",
            "start",
            "destinations",
            "admissions",
            "crashes",
            "inbound",
            "beat",
            "relay",
            "isolated",
        },
    )
    destinations = tuple(
        _destination(r, item, f"destinations[{i}]")
        for i, item in enumerate(r.listing(top.get("destinations", []), "destinations"))
    )
    names = [d.name for d in destinations]
    if len(set(names)) != len(names):
        raise r.error("destinations", "two destinations share a name")
    admissions = tuple(
        _admissions(r, item, f"admissions[{i}]", names)
        for i, item in enumerate(r.listing(top.get("admissions", []), "admissions"))
    )
    crashes = tuple(
        _crash(r, item, f"crashes[{i}]", names)
        for i, item in enumerate(r.listing(top.get("crashes", []), "crashes"))
    )
    isolated = tuple(r.text(n, "isolated") for n in r.listing(top.get("isolated", []), "isolated"))
    for n in isolated:
        if n not in names:
            raise r.error("isolated", f"{n!r} is not one of the destinations {names}")
    beat = r.mapping(top.get("beat", {}), "beat")
    if "relay_sweep" in beat:
        raise r.error(
            "beat.relay_sweep",
            "the relay polls for due messages itself (its own process, since 0.2): say "
            "relay: {poll: …}",
        )
    r.known(beat, "beat", {"retry_sweep", "silence_check"})
    relay = r.mapping(top.get("relay", {}), "relay")
    r.known(relay, "relay", {"processes", "poll"})
    start = top.get("start")
    scenario = Scenario(
        name=r.text(top.get("name"), "name"),
        description=r.text(top.get("description", ""), "description", empty=True),
        duration=r.duration(top.get("duration"), "duration"),
        destinations=destinations,
        admissions=admissions,
        crashes=crashes,
        inbound=_inbound(r, top["inbound"], "inbound") if "inbound" in top else None,
        beat=Beat(
            **{k: r.duration(v, f"beat.{k}", positive=True) for k, v in beat.items()},
        ),
        relay=Relay(
            processes=r.integer(relay.get("processes", 1), "relay.processes", minimum=1),
            poll=r.duration(relay.get("poll", 1.0), "relay.poll", positive=True),
        ),
        start=r.moment(start, "start") if start is not None else DEFAULT_START,
        isolated=isolated,
        path=path,
    )
    if scenario.relay.processes > MAX_RELAYS:
        raise r.error("relay.processes", f"at most {MAX_RELAYS} relay processes")
    if scenario.duration > MAX_DURATION:
        raise r.error("duration", f"at most {MAX_DURATION // 86400:g} days of simulated time")
    if not scenario.admissions and scenario.inbound is None:
        raise r.error("", "nothing happens: give it admissions, inbound events, or both")
    if scenario.admissions and not scenario.destinations:
        raise r.error("destinations", "admissions need at least one destination")
    check_bounds(scenario, r)
    return scenario


def _destination(r: Reader, data: Any, at: str) -> Destination:
    d = r.mapping(data, at)
    fields = {
        "name",
        "rate",
        "burst",
        "max_in_flight",
        "timeout",
        "max_attempts",
        "backoff_base",
        "backoff_cap",
        "retry_after_cap",
        "breaker_threshold",
        "breaker_cooldown",
        "delay",
        "faults",
        "enable_at",
        "recovery",
    }
    r.known(d, at, fields)
    values: dict[str, Any] = {"name": r.slug(d.get("name"), f"{at}.name")}
    if "rate" in d:
        values["rate_count"], values["rate_seconds"] = r.rate(d["rate"], f"{at}.rate")
    for key in ("burst", "max_in_flight", "max_attempts", "breaker_threshold"):
        if key in d:
            values[key] = r.integer(d[key], f"{at}.{key}", minimum=1)
    for key, attr in (
        ("timeout", "timeout_seconds"),
        ("backoff_base", "backoff_base_seconds"),
        ("backoff_cap", "backoff_cap_seconds"),
        ("retry_after_cap", "retry_after_cap_seconds"),
        ("breaker_cooldown", "breaker_cooldown_seconds"),
    ):
        if key in d:
            values[attr] = r.duration(d[key], f"{at}.{key}", positive=True)
    if "delay" in d:
        values["delay_seconds"] = r.duration(d["delay"], f"{at}.delay")
    if "enable_at" in d:
        values["enable_at"] = r.duration(d["enable_at"], f"{at}.enable_at")
    if "recovery" in d:
        count = values.get("rate_count", Destination.rate_count)
        ceiling = count / values.get("rate_seconds", Destination.rate_seconds)
        values["recovery"] = _recovery(r, d["recovery"], f"{at}.recovery", ceiling)
    values["faults"] = tuple(
        _fault(r, item, f"{at}.faults[{i}]")
        for i, item in enumerate(r.listing(d.get("faults", []), f"{at}.faults"))
    )
    return Destination(**values)


def _recovery(r: Reader, data: Any, at: str, ceiling: float) -> Recovery:
    """A recovery job an operator starts (``ceiling``: the destination's rate a second)."""
    # imported here: the format's words are the service's own (outbound/recovery.py)
    from ..outbound.recovery import ANSWER_CLASSES

    j = r.mapping(data, at)
    r.known(j, at, {"at", "kind", "since", "until", "rate", "events", "answers"})
    kind = r.text(j.get("kind", "recover"), f"{at}.kind")
    unsimulated = {
        "replay": "sends delivered keys again, which the invariants hold to one send",
        "missing": "writes messages no admission made, which the ledger does not count",
    }
    if kind in unsimulated:
        why = unsimulated[kind]
        raise r.error(f"{at}.kind", f"a run simulates no {kind} job (it {why}): write `recover`")
    if kind != "recover":
        raise r.error(f"{at}.kind", f"{kind!r}: write `recover` (its failed messages)")
    start = r.duration(j.get("at"), f"{at}.at")
    since = r.duration(j.get("since", 0), f"{at}.since")
    if since >= start:
        raise r.error(f"{at}.since", "must come before `at`: a job selects what was admitted")
    until = r.duration(j["until"], f"{at}.until") if "until" in j else None
    if until is not None and until <= since:
        raise r.error(f"{at}.until", "must come after `since`")
    rate = None
    if "rate" in j:
        count, seconds = r.rate(j["rate"], f"{at}.rate")
        rate = count / seconds
        if rate >= ceiling:
            raise r.error(
                f"{at}.rate",
                f"{j['rate']}: write a rate below the destination's own ({ceiling:g}/s), so "
                "that live traffic keeps its share",
            )
    answers = tuple(r.text(a, f"{at}.answers") for a in r.listing(j.get("answers", []), at))
    for answer in answers:
        if answer not in ANSWER_CLASSES:
            raise r.error(f"{at}.answers", f"{answer!r}: one of {', '.join(ANSWER_CLASSES)}")
    return Recovery(
        at=start,
        kind=kind,
        since=since,
        until=until,
        rate=rate,
        events=tuple(r.slug(e, f"{at}.events") for e in r.listing(j.get("events", []), at)),
        answers=answers,
    )


FAULT_KINDS = ("status", "lose_response", "timeout", "down", "slow")


def _fault(r: Reader, data: Any, at: str) -> Fault:
    f = r.mapping(data, at)
    r.known(
        f,
        at,
        {*FAULT_KINDS, "retry_after", "delay", "attempts", "share", "group", "events"}
        | {"from", "until"},
    )
    kinds = [k for k in FAULT_KINDS if k in f]
    if len(kinds) != 1:
        raise r.error(at, f"give exactly one of {', '.join(FAULT_KINDS)}")
    kind = kinds[0]
    status = None
    if kind == "status":
        status = r.integer(f["status"], f"{at}.status", minimum=100)
        if status > 599 or 200 <= status < 300:
            raise r.error(f"{at}.status", f"{status} is not an HTTP error status (300-599)")
    elif kind != "slow" and f[kind] is not True:
        raise r.error(f"{at}.{kind}", "write it as `true`")
    delay = None
    if kind == "slow":
        delay = r.duration(f["slow"], f"{at}.slow", positive=True)
    elif "delay" in f:
        if kind in ("timeout", "down"):
            raise r.error(f"{at}.delay", f"a {kind} takes no delay of its own")
        delay = r.duration(f["delay"], f"{at}.delay")
    window = None
    if "from" in f or "until" in f:
        window = Window(
            r.duration(f.get("from", 0), f"{at}.from"),
            r.duration(f.get("until", 10**9), f"{at}.until"),
        )
    retry_after = f.get("retry_after")
    return Fault(
        kind=kind,
        status=status,
        delay=delay,
        retry_after=None if retry_after is None else str(retry_after),
        attempts=tuple(
            r.integer(n, f"{at}.attempts", minimum=1)
            for n in r.listing(f.get("attempts", []), f"{at}.attempts")
        ),
        share=r.share(f.get("share", 1.0), f"{at}.share"),
        group=r.text(f.get("group", "default"), f"{at}.group"),
        events=tuple(r.text(e, f"{at}.events") for e in r.listing(f.get("events", []), at)),
        window=window,
    )


def _admissions(r: Reader, data: Any, at: str, names: list[str]) -> Admissions:
    a = r.mapping(data, at)
    r.known(
        a,
        at,
        {"orders", "start", "over", "events", "gap", "destinations", "ordering", "repeat"}
        | {"metadata", "prefix"},
    )
    targets = tuple(
        r.text(n, f"{at}.destinations") for n in r.listing(a.get("destinations", []), at)
    )
    for n in targets:
        if n not in names:
            raise r.error(f"{at}.destinations", f"{n!r} is not one of the destinations {names}")
    repeats = []
    for i, item in enumerate(r.listing(a.get("repeat", []), f"{at}.repeat")):
        rep = r.mapping(item, f"{at}.repeat[{i}]")
        r.known(rep, f"{at}.repeat[{i}]", {"share", "after"})
        repeats.append(
            Repeat(
                r.share(rep.get("share"), f"{at}.repeat[{i}].share"),
                r.duration(rep.get("after"), f"{at}.repeat[{i}].after"),
            )
        )
    metadata = r.mapping(a.get("metadata", {}), f"{at}.metadata")
    events = tuple(r.slug(e, f"{at}.events") for e in r.listing(a.get("events", ["paid"]), at))
    if not events:
        raise r.error(f"{at}.events", "name at least one event")
    return Admissions(
        orders=r.integer(a.get("orders"), f"{at}.orders", minimum=1),
        start=r.duration(a.get("start", 0), f"{at}.start"),
        over=r.duration(a.get("over", 60), f"{at}.over"),
        events=events,
        gap=r.duration(a.get("gap", 1), f"{at}.gap"),
        destinations=targets,
        ordering=r.boolean(a.get("ordering", False), f"{at}.ordering"),
        repeats=tuple(repeats),
        metadata=dict(metadata),
        prefix=r.slug(a.get("prefix", "ord"), f"{at}.prefix"),
    )


def _crash(r: Reader, data: Any, at: str, names: list[str]) -> Crash:
    c = r.mapping(data, at)
    r.known(c, at, {"at", "destination", "after"})
    destination = r.text(c.get("destination"), f"{at}.destination")
    if destination not in names:
        raise r.error(f"{at}.destination", f"{destination!r} is not one of {names}")
    after = c.get("after", "send")
    if after not in ("claim", "send"):
        raise r.error(f"{at}.after", f"{after!r}: write `claim` or `send`")
    return Crash(r.duration(c.get("at"), f"{at}.at"), destination, after)


def _inbound(r: Reader, data: Any, at: str) -> Inbound:
    i = r.mapping(data, at)
    r.known(
        i,
        at,
        {"events", "over", "silence_after", "duplicates", "late", "silent", "fail_after_effect"},
    )
    dup = r.mapping(i.get("duplicates", {"share": 0}), f"{at}.duplicates")
    r.known(dup, f"{at}.duplicates", {"share", "after"})
    late = r.mapping(i.get("late", {"share": 0}), f"{at}.late")
    r.known(late, f"{at}.late", {"share", "by"})
    silent = []
    for n, item in enumerate(r.listing(i.get("silent", []), f"{at}.silent")):
        w = r.mapping(item, f"{at}.silent[{n}]")
        r.known(w, f"{at}.silent[{n}]", {"from", "until"})
        start = r.duration(w.get("from"), f"{at}.silent[{n}].from")
        end = r.duration(w.get("until"), f"{at}.silent[{n}].until")
        if end <= start:
            raise r.error(f"{at}.silent[{n}]", "`until` must come after `from`")
        silent.append(Window(start, end))
    return Inbound(
        events=r.integer(i.get("events"), f"{at}.events", minimum=1),
        over=r.duration(i.get("over", 600), f"{at}.over"),
        silence_after=r.duration(i.get("silence_after", 1200), f"{at}.silence_after"),
        duplicates=r.share(dup.get("share", 0), f"{at}.duplicates.share"),
        duplicates_after=r.duration(dup.get("after", 30), f"{at}.duplicates.after"),
        late=r.share(late.get("share", 0), f"{at}.late.share"),
        late_by=r.duration(late.get("by", 300), f"{at}.late.by"),
        silent=tuple(silent),
        fail_after_effect=r.share(i.get("fail_after_effect", 0), f"{at}.fail_after_effect"),
    )


# --- bounds -------------------------------------------------------------------------------


def check_bounds(scenario: Scenario, r: Reader) -> None:
    """Refuse a scenario that asks for more work than a run takes (admissions, a sender's
    posts, requests, beat ticks, list lengths) or that a run could not hold, naming the
    place, the count and the bound: counted before anything is built (bounds.py)."""
    check_work(scenario, r)
    # imported here: the steps' interval is the relay process's (recoveries.py)
    from .recoveries import check_recoveries

    check_recoveries(scenario, r)
