"""A scenario file is untrusted input: whatever it holds (a count of a hundred million,
a "billion laughs", nesting 20,000 deep, bytes that are not text) the command answers
with exit status 3 and one line naming the file and the place, quickly, in little
memory, before anything is built; never a traceback, a RecursionError nor a run that
does not end."""

from __future__ import annotations

import io
import json
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook_receiver.evaluation import bounds, reading, scenario
from webhook_receiver.evaluation.reading import ScenarioError
from webhook_receiver.management.commands import webhook_eval

DATA = Path(__file__).parent / "data"

MINIMAL: dict[str, Any] = {
    "name": "tiny",
    "duration": "1m",
    "destinations": [{"name": "shop"}],
    "admissions": [{"orders": 1}],
}

LAUGHS = """\
name: laughs
duration: 1m
destinations: [{name: shop}]
admissions:
  - orders: 1
    metadata:
      a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
      b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
      c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
      d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
      e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
      f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
      g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
      h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
      i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


@pytest.fixture
def eval_in_process(monkeypatch) -> Iterator[Any]:
    """The command in this process, its run's database forbidden: a scenario refused
    must be refused before anything is made. Returns (exit status, stderr, seconds,
    peak bytes allocated)."""

    def no_database(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the run's database was asked for: the scenario was accepted")

    monkeypatch.setattr(webhook_eval, "own_database", no_database)

    def run(*args: str) -> tuple[int, str, float, int]:
        stderr = io.StringIO()
        tracemalloc.start()
        began = time.perf_counter()
        try:
            with pytest.raises(SystemExit) as exited:
                call_command("webhook_eval", *args, stdout=io.StringIO(), stderr=stderr)
            seconds = time.perf_counter() - began
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        return int(exited.value.code or 0), stderr.getvalue(), seconds, peak

    yield run


def test_a_hundred_million_orders_are_refused_at_once_with_the_bound(eval_in_process, tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text(
        "name: big\nduration: 1h\ndestinations: [{name: shop}]\nadmissions: [{orders: 100000000}]\n"
    )

    status, stderr, seconds, peak = eval_in_process(str(big))

    assert status == 3
    assert (
        "big.yaml: admissions[0].orders: 100,000,000 orders × 1 event × 1 destination asks "
        f"for 100,000,000 admissions; a run takes at most {bounds.MAX_ADMISSIONS:,}" in stderr
    )
    assert seconds < 2 and peak < 20 * 2**20


def test_a_billion_laughs_is_refused_in_little_memory(eval_in_process, tmp_path):
    laughs = tmp_path / "laughs.yaml"
    laughs.write_text(LAUGHS)

    status, stderr, seconds, peak = eval_in_process(str(laughs))

    assert status == 3
    assert (
        "laughs.yaml: admissions[0].metadata.a (line 7): aliases and anchors are not accepted"
        in stderr
    )
    assert seconds < 2 and peak < 20 * 2**20


@pytest.mark.parametrize(
    ("name", "text", "place"),
    [
        ("deep.yaml", "x: " + "[" * 20_000 + "]" * 20_000 + "\n", "deep.yaml: x[0][0]"),
        ("deep.json", '{"x": ' + "[" * 20_000 + "]" * 20_000 + "}", "deep.json: line 1, column"),
        ("deep.yaml", "x:\n" + "".join(" " * n + "- a:\n" for n in range(0, 400, 2)), "line"),
    ],
)
def test_nesting_20_000_deep_is_refused_not_a_recursion_error(
    eval_in_process, tmp_path, name, text, place
):
    path = tmp_path / name
    path.write_text(text)

    status, stderr, seconds, _ = eval_in_process(str(path))

    assert status == 3
    assert place in stderr and f"nested deeper than {reading.MAX_DEPTH} levels" in stderr
    assert "Traceback" not in stderr and seconds < 10


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("latin.yaml", "name: caf\xe9\n".encode("latin-1"), "latin.yaml: line 1: not UTF-8 text"),
        ("huge.yaml", b"# " + b"x" * (1 << 20), "huge.yaml: larger than 1 MiB"),
        ("digits.yaml", b"name: x\nduration: " + b"9" * 5000 + b"\n", "digits.yaml: not valid"),
        ("digits.json", b'{"duration": ' + b"9" * 5000 + b"}", "digits.json: not valid JSON"),
        ("python.yaml", b"name: !!python/object:os.system x\n", "python.yaml: not valid YAML"),
        ("two.yaml", b"name: a\n---\nname: b\n", "two.yaml: not valid YAML"),
    ],
)
def test_a_file_that_cannot_be_read_says_why(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)

    with pytest.raises(ScenarioError) as caught:
        scenario.load(str(path))

    assert str(caught.value).startswith(message)


def test_a_directory_or_an_endless_file_is_refused():
    with pytest.raises(ScenarioError, match="^tmp: cannot be read"):
        scenario.load("/tmp")
    with pytest.raises(ScenarioError, match="^zero: larger than 1 MiB"):
        scenario.load("/dev/zero")


def test_an_alias_is_refused_even_where_the_value_would_do(tmp_path):
    path = tmp_path / "alias.yaml"
    path.write_text(
        "name: alias\nduration: 1m\ndestinations: [{name: &shop shop}]\n"
        "admissions: [{orders: 1, destinations: [*shop]}]\n"
    )

    with pytest.raises(ScenarioError) as caught:
        scenario.load(str(path))

    assert str(caught.value) == (
        "alias.yaml: destinations[0].name (line 3): aliases and anchors are not accepted: "
        "write the value out in full where it is used"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"admissions": [{"orders": 150_000, "events": ["paid", "shipped"]}]},
            "admissions[0].orders: 150,000 orders × 2 events × 1 destination asks for "
            "300,000 admissions",
        ),
        (
            {"admissions": [{"orders": 60_000, "repeat": [{"share": 0.1, "after": 1}] * 4}]},
            "× (1 + 4 repeats) asks for 300,000 admissions",
        ),
        (
            {"admissions": [{"orders": 200_000}, {"orders": 60_000}]},
            "admissions: 2 entries ask for 260,000 admissions in all; a run takes at most",
        ),
        (
            {"inbound": {"events": 200_000, "duplicates": {"share": 0.01}}},
            "inbound.events: 200,000 events and as many redeliveries ask for 400,000 posts",
        ),
        (
            {"duration": "31d", "relay": {"poll": "1ms"}},
            "relay.poll: every 0.001 s for 31 days asks for 2,678,400,001 runs",
        ),
        (
            {"duration": "1h", "relay": {"poll": 5e-324}},
            "every 4.94066e-324 s for 1 hour asks for more than 10^308 runs",
        ),
        (
            {
                "duration": "31d",
                "admissions": [{"orders": 250_000}],
                "destinations": [{"name": "shop", "max_attempts": 13, "rate": "100/s"}],
            },
            "destinations[0].max_attempts: 250,000 admissions × 13 attempts may make "
            "3,250,000 requests if every attempt fails",
        ),
        (
            {"destinations": [{"name": f"d{n}"} for n in range(101)]},
            "destinations: 101 destinations; a run takes at most 100",
        ),
        (
            {"crashes": [{"at": 1, "destination": "shop"}] * 1001},
            "crashes: 1,001 entries; a list takes at most 1,000",
        ),
        (
            {"destinations": [{"name": "shop", "burst": 2**31}]},
            "destinations[0].burst: 2,147,483,648 is more than a destination's column holds",
        ),
        (
            {"destinations": [{"name": "shop", "timeout": "40d"}]},
            "destinations[0].timeout: at most 31 days",
        ),
        ({"start": "1960-01-01T00:00:00Z"}, "start: 1960-01-01T00:00:00+00:00: write a time"),
        (
            {"admissions": [{"orders": 1, "metadata": {"notes": "x" * 5000}}]},
            "admissions[0].metadata: metadata is 5012 bytes as JSON, over the limit",
        ),
    ],
)
def test_a_scenario_that_asks_for_too_much_says_how_much_and_the_bound(change, message):
    data = {**MINIMAL, **change}
    began = time.perf_counter()

    with pytest.raises(ScenarioError) as caught:
        scenario.parse(data, where="big.yaml")

    assert message in str(caught.value) and str(caught.value).startswith("big.yaml: ")
    assert time.perf_counter() - began < 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"destinations": [{"name": "shop", "rate": "9" * 5000 + "/s"}]},
            "destinations[0].rate: '99999",
        ),
        ({"admissions": [{"orders": -(10**5000)}]}, "got a number of more than 4,300 digits"),
        ({"duration": [[[[[[["deep"]]]]]]]}, "duration: [[[[...]]]] is not a duration"),
        ({"relay": {"poll": "x" * 10**6}}, "relay.poll: 'xxxxxxxxxxxxxxxxxx"),
    ],
)
def test_a_value_too_long_to_show_is_shown_short(change, message):
    with pytest.raises(ScenarioError) as caught:
        scenario.parse({**MINIMAL, **change}, where="big.yaml")

    assert message in str(caught.value) and len(str(caught.value)) < 300


def test_a_month_long_run_of_a_team_fits():
    month = scenario.parse(
        {
            "name": "month",
            "duration": "31d",
            "relay": {"poll": "1s"},
            "destinations": [{"name": "a", "rate": "5/s"}, {"name": "b"}],
            "admissions": [
                {"orders": 40_000, "over": "30d", "events": ["paid", "fulfilled"]},
                {
                    "orders": 10_000,
                    "start": "15d",
                    "over": "1h",
                    "repeat": [{"share": 0.2, "after": 60}],
                },
            ],
            "inbound": {"events": 100_000, "over": "30d", "duplicates": {"share": 0.3}},
        },
        where="month.yaml",
    )

    assert month.duration == 31 * 86400


def test_the_built_in_scenarios_and_the_test_data_fit_ten_times_over(monkeypatch):
    for bound in (
        "MAX_ADMISSIONS",
        "MAX_INBOUND_POSTS",
        "MAX_REQUESTS",
        "MAX_BEAT_TICKS",
        "MAX_DESTINATIONS",
        "MAX_ENTRIES",
    ):
        monkeypatch.setattr(bounds, bound, getattr(bounds, bound) // 10)
    monkeypatch.setattr(reading, "MAX_FILE_BYTES", reading.MAX_FILE_BYTES // 10)
    monkeypatch.setattr(reading, "MAX_DEPTH", reading.MAX_DEPTH // 10)

    for name in scenario.built_in_names():
        scenario.load(name)
    for path in sorted(DATA.glob("*.yaml")):
        scenario.load(str(path))


# --- whatever the file holds ------------------------------------------------------------

leaves = st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats() | st.text(max_size=8)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
keys = st.sampled_from(
    ["name", "duration", "destinations", "admissions", "crashes", "inbound", "beat", "metadata"]
)


@st.composite
def documents(draw: st.DrawFn) -> Any:
    """A scenario-like document: some keys of a scenario, a value shared between places
    (which YAML writes as an anchor and aliases), the whole wrapped some levels deep."""
    document: Any = draw(st.dictionaries(keys, values, max_size=6))
    shared = draw(values)
    if draw(st.booleans()):
        document["admissions"] = [{"orders": 1, "metadata": {"a": shared, "b": shared}}]
    for _ in range(draw(st.integers(0, 3 * reading.MAX_DEPTH))):
        document = draw(st.sampled_from([[document], {"x": document}]))
    return document


def _answers_with_a_scenario_or_its_error(path: Path) -> None:
    try:
        scenario.load(str(path))
    except ScenarioError as exc:
        assert str(exc).startswith(f"{path.name}: ")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_whatever_yaml_holds_the_answer_is_a_scenario_or_a_scenario_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "fuzz.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))

    _answers_with_a_scenario_or_its_error(path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_whatever_json_holds_the_answer_is_a_scenario_or_a_scenario_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "fuzz.json"
    path.write_text(json.dumps(data))

    _answers_with_a_scenario_or_its_error(path)


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=200)
    | st.text(alphabet="[]{}&*!|>:-,?'\"\\#% \nabc01", max_size=200).map(str.encode),
    st.sampled_from(["fuzz.yaml", "fuzz.json"]),
)
def test_whatever_bytes_a_file_holds_the_answer_is_a_scenario_or_a_scenario_error(
    tmp_path_factory, content, name
):
    path = tmp_path_factory.mktemp("fuzz") / name
    path.write_bytes(content)

    _answers_with_a_scenario_or_its_error(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"workers": 2}, "workers: the relay is a process of its own since 0.2"),
        ({"beat": {"relay_sweep": "5s"}}, "beat.relay_sweep: the relay polls for due messages"),
        ({"relay": {"processes": 17}}, "relay.processes: expected at most 16, got 17"),
        ({"relay": {"sweep": "1s"}}, "relay: unknown key 'sweep' (known: poll, processes)"),
    ],
)
def test_the_relay_keys_of_an_older_scenario_say_what_replaced_them(change, message):
    with pytest.raises(ScenarioError) as caught:
        scenario.parse({**MINIMAL, **change}, where="old.yaml")

    assert message in str(caught.value)
