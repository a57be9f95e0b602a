"""A scenario file read safely, the values of its format (durations are seconds or text,
``90s``, ``5m``, ``1h30m``; rates are ``count/duration``, ``5/s``, ``300/1m``), and the
words its errors are said in: every error names the file and the place, and says what to
write instead.

A scenario file is untrusted input: it is read whole only up to MAX_FILE_BYTES, YAML
aliases and anchors are refused (a few lines of them expand to gigabytes), and nesting
deeper than MAX_DEPTH is refused before any object is built (building recurses)."""

from __future__ import annotations

import json
import math
import operator
import re
import reprlib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, Field, PlainValidator, Strict, StringConstraints
from pydantic_core import PydanticCustomError

# a scenario file's size at most: the largest built-in one is under 3 KB
MAX_FILE_BYTES = 1 << 20
# nesting at most: a scenario needs five levels (destinations[0].faults[0].attempts),
# metadata a few more; far below where building objects would exhaust the stack
MAX_DEPTH = 64


class ScenarioError(ValueError):
    """A scenario file that cannot be run, and why (one line a person can act on)."""


def read_document(path: Path) -> Any:
    """The data of a scenario file (.json: JSON, else YAML), read within the bounds above;
    anything unreadable is a ScenarioError naming the file and the place."""
    where = path.name
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(f"{where}: cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ScenarioError(
            f"{where}: larger than {MAX_FILE_BYTES / 2**20:g} MiB: a scenario takes a few "
            "kilobytes; describe traffic by counts and spans (orders: 3000, over: 1m), "
            "not one entry per event"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ScenarioError(
            f"{where}: line {line}: not UTF-8 text (byte {exc.start:,} of the file): "
            "save it as UTF-8"
        ) from None
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        if kind == "JSON":
            _check_json_depth(text)
            return json.loads(text)
        return yaml.load(text, Loader=_ScenarioLoader)
    except _Refused as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    except (ValueError, yaml.YAMLError) as exc:
        # ValueError: JSON's decode errors, and a number of more than 4,300 digits
        raise ScenarioError(f"{where}: not valid {kind}: {exc}") from None


class _Refused(Exception):
    """Something a scenario file may not hold, and where (the file's name is added)."""


class _ScenarioLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases and anchors (each alias is a reference the
    reader would expand: nine lines of them are a "billion laughs") and nesting deeper
    than MAX_DEPTH, while the document is composed, before anything is built. It keeps
    the path to the node being composed, for the error."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._path: list[str] = []
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        self._path.append(_segment(parent, index))
        try:
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise _Refused(
                    f"{self._place(event)}: aliases and anchors are not accepted: "
                    "write the value out in full where it is used"
                )
            if isinstance(event, yaml.CollectionStartEvent):
                if self._depth >= MAX_DEPTH:
                    raise _Refused(
                        f"{self._place(event)}: nested deeper than {MAX_DEPTH} levels: "
                        "a scenario needs a handful"
                    )
                self._depth += 1
                try:
                    return super().compose_node(parent, index)
                finally:
                    self._depth -= 1
            return super().compose_node(parent, index)
        finally:
            self._path.pop()

    def _place(self, event: yaml.Event) -> str:
        path = "".join(self._path).lstrip(".")
        if len(path) > 60:  # a deep path: its start and its end say where
            path = f"{path[:30]}…{path[-25:]}"
        mark = event.start_mark
        line = f"line {mark.line + 1}" if mark is not None else "the document"
        return f"{path} ({line})" if path else line


def _segment(parent: yaml.Node | None, index: Any) -> str:
    """The step from ``parent`` to the node at ``index``: ``[n]`` in a sequence, ``.key``
    for a mapping's value, ``.<key>`` for a mapping's key, nothing for the document."""
    if isinstance(index, int) and not isinstance(index, bool):
        return f"[{index}]"
    if isinstance(index, yaml.ScalarNode):
        return f".{index.value}"
    if isinstance(parent, yaml.MappingNode):
        return ".<key>"
    return ""


# a JSON string (escapes and all), or a bracket outside one
_JSON_BRACKETS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _check_json_depth(text: str) -> None:
    """Refuse JSON nested deeper than MAX_DEPTH before decoding it: the decoder
    recurses, and 20,000 brackets would end in a RecursionError."""
    depth = 0
    for token in _JSON_BRACKETS.finditer(text):
        bracket = token.group()
        if bracket in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                line = text.count("\n", 0, token.start()) + 1
                column = token.start() - text.rfind("\n", 0, token.start())
                raise _Refused(
                    f"line {line}, column {column}: nested deeper than {MAX_DEPTH} levels: "
                    "a scenario needs a handful"
                )
        elif bracket in "]}":
            depth -= 1


def refusal(at: str, problem: str) -> PydanticCustomError:
    """A scenario refused while its models validate it: ``problem``, at ``at`` below the
    value being validated (``recovery.rate`` of a destination; empty: the value itself).
    The problem is the error's context, not its template: it may hold braces."""
    return PydanticCustomError("scenario", "{problem}", {"problem": problem, "at": at})


def described(value: Any) -> str:
    """A value's kind and the value, as "got …" says it."""
    return "nothing" if value is None else f"{type(value).__name__} {shown(value)}"[:80]


# a value as an error shows it: a few levels and items, however large or deep it is
_SHORT = reprlib.Repr()
_SHORT.maxlevel = 3
_SHORT.maxstring = 60
_SHORT.maxother = 60


def shown(value: Any) -> str:
    try:
        return _SHORT.repr(value)
    except ValueError:  # an int of more than 4,300 digits has no decimal text
        return "a number of more than 4,300 digits"


# --- the format's values ------------------------------------------------------------------

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|min|s|m|h|d)")
_SLUG = re.compile(r"[A-Za-z0-9_-]{1,60}")


def _seconds(value: Any) -> float | None:
    """Seconds, from a number or a text (90, "90s", "1h30m"); None if it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) and value >= 0 else None
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = _DURATION.findall(text)
    if not parts or _DURATION.sub("", text).strip():
        return None
    seconds = sum(float(n) * _UNITS[unit] for n, unit in parts)
    return seconds if math.isfinite(seconds) else None


def _duration(*, positive: bool) -> Callable[[Any], float]:
    def seconds(value: Any) -> float:
        found = _seconds(value)
        if found is None or (positive and found <= 0):
            raise refusal(
                "", f"{shown(value)} is not a duration: write seconds (90) or text (90s, 5m, 1h30m)"
            )
        return found

    return seconds


def _rate(value: Any) -> tuple[int, float]:
    try:
        count, _, per = str(value).partition("/")
        seconds = _seconds(f"1{per}" if per.isalpha() else per) if per else None
        number = int(count) if count.strip().isdigit() else 0
    except ValueError:  # a count of more than 4,300 digits
        number, seconds = 0, None
    if number < 1 or not seconds or seconds <= 0:
        raise refusal("", f"{shown(value)} is not a rate: write count/duration (5/s, 300/1m)")
    return number, seconds


def _moment(value: Any) -> datetime:
    try:  # YAML reads an unquoted time as a datetime: its text is ISO 8601 too
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise refusal("", f"{shown(value)}: write an ISO 8601 time with its offset (…Z)")
    return moment.astimezone(UTC)


def _slug(text: str) -> str:
    if not _SLUG.fullmatch(text):
        raise refusal("", f"{shown(text)}: letters, digits, '-' and '_' only (at most 60)")
    return text


# the format's types of value (inputs.py's fields): each refusal says what to write
Seconds = Annotated[float, PlainValidator(_duration(positive=False))]
PositiveSeconds = Annotated[float, PlainValidator(_duration(positive=True))]
Rate = Annotated[tuple[int, float], PlainValidator(_rate)]
PerSecond = Annotated[float, PlainValidator(lambda value: operator.truediv(*_rate(value)))]
Moment = Annotated[datetime, PlainValidator(_moment)]
Text = Annotated[str, StringConstraints(strict=True, min_length=1)]
Slug = Annotated[Text, AfterValidator(_slug)]
Count = Annotated[int, Strict(), Field(ge=1)]
Share = Annotated[float, Strict(), Field(ge=0, le=1)]
