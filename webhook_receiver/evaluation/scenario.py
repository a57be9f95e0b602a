"""A scenario: the frozen inputs of one evaluation (inputs.py), read from a YAML or JSON
file (reading.py) and validated, with an error that names the file, the place and what
to write instead.

The format is documented in docs/eval.md; the built-in scenarios (``scenarios/``) are
examples of every key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, get_args

from pydantic import AfterValidator, BaseModel, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from .bounds import check_work
from .inputs import BUILT_IN, Scenario
from .reading import ScenarioError, described, read_document, shown

__all__ = ["ScenarioError", "built_in_names", "load", "parse"]


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


def _within_bounds(scenario: Scenario) -> Scenario:
    """Refuse a scenario that asks for more work than a run takes, or that a run could not
    hold, naming the place, the count and the bound (bounds.py), before anything is built."""
    check_work(scenario)
    # imported here: the steps' interval is the relay process's (recoveries.py)
    from .recoveries import check_recoveries

    check_recoveries(scenario)
    return scenario


# the format's models, then the bounds: one validation, whose first error is said
_RUNNABLE = TypeAdapter(Annotated[Scenario, AfterValidator(_within_bounds)])


def parse(data: Any, *, where: str = "scenario", path: str = "") -> Scenario:
    """The scenario ``data`` describes, or a ScenarioError saying of its first mistake
    where it is (``where``: the file's name) and what is wrong."""
    try:
        return _RUNNABLE.validate_python(data, context={"path": path})
    except ValidationError as exc:
        raise ScenarioError(f"{where}: {_said(exc.errors(include_url=False)[0])}") from None


# pydantic's errors of a value's type, in the format's words ("got" and the value follow)
_EXPECTED = {
    "model_type": "expected a mapping of keys to values",
    "dict_type": "expected a mapping of keys to values",
    "tuple_type": "expected a list",
    "string_type": "expected text",
    "string_too_short": "expected text",
    "int_type": "expected a whole number",
    "float_type": "expected a number",
    "bool_type": "expected true or false",
}


def _said(error: ErrorDetails) -> str:
    """One error of the validation as a line: the place (``destinations[0].rate``), then
    what is wrong."""
    kind, value, context = error["type"], error["input"], error.get("ctx", {})
    # an unknown key is said of its mapping, whose keys the problem lists
    loc = error["loc"][:-1] if kind == "extra_forbidden" else error["loc"]
    place = "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in loc)
    if context.get("at"):  # a rule that spans keys names the key below the value
        place += f".{context['at']}"
    if kind == "scenario":
        problem = context["problem"]
    elif kind in _EXPECTED:
        problem = f"{_EXPECTED[kind]}, got {described(value)}"
    elif kind == "missing":
        problem = "required, and missing"
    elif kind == "extra_forbidden":
        problem = f"unknown key {error['loc'][-1]!r} (known: {', '.join(_known_keys(loc))})"
    elif kind == "invalid_key":
        problem = f"{shown(value)}: a key is text"
    elif kind in ("greater_than_equal", "less_than_equal"):
        bound = context["ge"] if "ge" in context else context["le"]
        problem = f"expected {'at least' if 'ge' in context else 'at most'} {bound:g}, got "
        problem += shown(value)
    elif kind == "too_short":
        problem = f"give at least {context['min_length']}"
    elif kind == "literal_error":
        problem = f"{shown(value)}: write {context['expected']}"
    elif kind == "value_error":
        problem = str(context["error"])
    else:
        problem = error["msg"]
    place = place.lstrip(".")
    return f"{place}: {problem}" if place else problem


def _known_keys(loc: tuple[int | str, ...]) -> list[str]:
    """The keys of the mapping at ``loc`` (the file's words: aliases where given)."""
    model: type[BaseModel] = Scenario
    for step in loc:
        if isinstance(step, str):  # a key; an index stays in the list's model
            annotation = model.model_fields[_field_name(model, step)].annotation
            model = next(
                t
                for t in (annotation, *get_args(annotation))
                if isinstance(t, type) and not get_args(t) and issubclass(t, BaseModel)
            )
    return sorted(info.alias or name for name, info in model.model_fields.items())


def _field_name(model: type[BaseModel], key: str) -> str:
    return next(n for n, info in model.model_fields.items() if (info.alias or n) == key)
