"""A destination's filter: which of the events it subscribes to it is sent, declared in
JSON and evaluated at admission, in the caller's transaction.

    {"data.status": "paid"}                                  equality (a shorthand of $eq)
    {"data.amount": {"$in": [100, 200]}, "type": {"$startsWith": "order."}}   every key: and
    {"$or": [{"metadata.channel": "web"}, {"data.coupon": {"$exist": true}}]}

A key names the event's ``type``, a top-level field of its ``data`` (``data.status``)
or of the message's metadata (``metadata.channel``); its condition is a value (equal
to it) or an object of operators, all of which must hold: ``$eq``, ``$neq``, ``$in``,
``$nin`` (a list), ``$startsWith`` (a string), ``$exist`` (true or false). ``$and`` and
``$or`` take a list of filters. No regular expression and no code: a filter is cheap,
and says in words why an event did not pass.

An event the filter does not pass is admitted as a message already discarded, by
``filter``, with the reason (``data.status is 'cancelled', not 'paid'``): the message's
story says so, rather than leave a gap. A filter that cannot be read (one written to the
database by hand) passes nothing, for its own destination only, and says why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# what a filter may be at most: a few conditions, not a program
MAX_BYTES = 4096
MAX_DEPTH = 8
OPERATORS = ("$eq", "$neq", "$in", "$nin", "$startsWith", "$exist")
FIELDS = "type, data.<field> or metadata.<field>"
_MISSING = object()


class FilterError(ValueError):
    """A filter that cannot be read; its message says where and why."""


def filter_problem(spec: Any) -> str | None:
    """Why ``spec`` is not a filter a destination may keep, or None (None: no filter)."""
    if spec is None:
        return None
    try:
        size = len(json.dumps(spec, ensure_ascii=False, allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        return f"a filter is JSON: {exc}"
    if size > MAX_BYTES:
        return f"a filter is at most {MAX_BYTES} bytes of JSON ({size} here)"
    try:
        _check(spec, "the filter", 0)
    except FilterError as exc:
        return str(exc)
    return None


def filter_verdict(
    spec: Any, event_type: str, payload: Any, metadata: Mapping[str, Any]
) -> str | None:
    """None when the event passes the filter (or there is none); otherwise why it did
    not, in words. A filter that cannot be read passes nothing and says so."""
    if spec is None:
        return None
    problem = filter_problem(spec)
    if problem is not None:
        return f"the destination's filter cannot be read: {problem}"
    data = payload.get("data") if isinstance(payload, Mapping) else None
    event = {"type": event_type, "data": data, "metadata": metadata}
    return _why_not(spec, event)


def _check(spec: Any, where: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise FilterError(f"{where}: nested deeper than {MAX_DEPTH}")
    if not isinstance(spec, Mapping) or not spec:
        raise FilterError(f"{where} must be a non-empty JSON object")
    for key, condition in spec.items():
        if key in ("$and", "$or"):
            if not isinstance(condition, list) or not condition:
                raise FilterError(f"{where}: {key} takes a non-empty list of filters")
            for n, inner in enumerate(condition, 1):
                _check(inner, f"{key} #{n}", depth + 1)
            continue
        if not isinstance(key, str) or _field(key) is None:
            raise FilterError(f"{where}: {key!r} is not a field ({FIELDS}) nor $and, $or")
        if isinstance(condition, Mapping):
            _check_operators(key, condition)
        elif not _scalar(condition):
            raise FilterError(f"{key}: a value to equal is a string, a number, true, false or null")


def _check_operators(key: str, condition: Mapping[str, Any]) -> None:
    if not condition:
        raise FilterError(f"{key}: no operator ({', '.join(OPERATORS)})")
    for op, operand in condition.items():
        if op not in OPERATORS:
            raise FilterError(f"{key}: {op!r} is not an operator ({', '.join(OPERATORS)})")
        if op in ("$eq", "$neq") and not _scalar(operand):
            raise FilterError(f"{key}: {op} takes a string, a number, true, false or null")
        if op in ("$in", "$nin") and not (
            isinstance(operand, list) and operand and all(_scalar(v) for v in operand)
        ):
            raise FilterError(f"{key}: {op} takes a non-empty list of plain values")
        if op == "$startsWith" and not isinstance(operand, str):
            raise FilterError(f"{key}: $startsWith takes a string")
        if op == "$exist" and not isinstance(operand, bool):
            raise FilterError(f"{key}: $exist takes true or false")


def _field(key: str) -> tuple[str, str | None] | None:
    """``type`` → ("type", None); ``data.status`` → ("data", "status"); else None."""
    if key == "type":
        return ("type", None)
    root, dot, name = key.partition(".")
    if root in ("data", "metadata") and dot and name and "." not in name:
        return (root, name)
    return None


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _why_not(spec: Mapping[str, Any], event: dict[str, Any]) -> str | None:
    for key, condition in spec.items():
        if key == "$and":
            for inner in condition:
                if (reason := _why_not(inner, event)) is not None:
                    return reason
        elif key == "$or":
            reasons = [_why_not(inner, event) for inner in condition]
            if all(r is not None for r in reasons):
                return "none of $or: " + "; ".join(r for r in reasons if r is not None)
        else:
            reason = _condition_fails(key, condition, _value(key, event))
            if reason is not None:
                return reason
    return None


def _value(key: str, event: dict[str, Any]) -> Any:
    root, name = _field(key) or ("", None)
    if name is None:
        return event.get(root, _MISSING)
    holder = event.get(root)
    if not isinstance(holder, Mapping):
        return _MISSING
    return holder.get(name, _MISSING)


def _condition_fails(key: str, condition: Any, value: Any) -> str | None:
    operators = condition if isinstance(condition, Mapping) else {"$eq": condition}
    shown = "missing" if value is _MISSING else repr(value)
    present = value is not _MISSING
    for op, operand in operators.items():
        if op == "$exist":
            holds = present == operand
            why = f"the filter asks that it {'' if operand else 'not '}exist"
        elif op == "$eq":
            holds = present and _equal(value, operand)
            why = f"not {operand!r}"
        elif op == "$neq":
            holds = not (present and _equal(value, operand))
            why = "which the filter leaves out"
        elif op == "$in":
            holds = present and any(_equal(value, v) for v in operand)
            why = f"not one of {operand!r}"
        elif op == "$nin":
            holds = not (present and any(_equal(value, v) for v in operand))
            why = f"one of {operand!r}, which the filter leaves out"
        else:  # $startsWith
            holds = isinstance(value, str) and value.startswith(operand)
            why = f"which does not start with {operand!r}"
        if not holds:
            return f"{key} is {shown}, {why}"
    return None


def _equal(value: Any, operand: Any) -> bool:
    """JSON's equality: true is not 1, and a number is not its string."""
    if isinstance(value, bool) or isinstance(operand, bool):
        return isinstance(value, bool) and isinstance(operand, bool) and value == operand
    if isinstance(value, int | float) and isinstance(operand, int | float):
        return value == operand
    return type(value) is type(operand) and value == operand
