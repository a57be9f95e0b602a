"""Scenario files: every built-in one reads, and a file a team writes is refused with
an error that names the file, the place and what to write instead; nothing else
escapes the reader, whatever the file holds."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook_receiver.evaluation import scenario
from webhook_receiver.evaluation.reading import ScenarioError

MINIMAL = {
    "name": "tiny",
    "duration": "1m",
    "destinations": [{"name": "shop"}],
    "admissions": [{"orders": 1}],
}


def test_every_built_in_scenario_reads_and_names_itself():
    names = scenario.built_in_names()

    assert {
        "repeated-keys",
        "retry-after",
        "lost-response",
        "relay-crash",
        "ordering-key",
        "destination-down",
        "inbound",
        "flash-sale",
    } <= set(names)
    for name in names:
        loaded = scenario.load(name)
        assert loaded.name == name and loaded.description


def test_json_and_yaml_files_read_alike(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(MINIMAL))

    loaded = scenario.load(str(path))

    assert loaded.duration == 60 and loaded.destinations[0].rate_count == 10


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"duration": "soon"}, "tiny.json: duration: 'soon' is not a duration"),
        ({"duration": float("inf")}, "duration: inf is not a duration"),
        ({"duration": "40d"}, "duration: at most 31 days of simulated time"),
        ({"destinations": [{"name": "shop", "rate": "fast"}]}, "destinations[0].rate: 'fast'"),
        ({"destinations": [{"name": "shop", "burst": -1}]}, "destinations[0].burst: expected a"),
        ({"destinations": [{"name": "a b"}]}, "destinations[0].name: 'a b': letters, digits"),
        ({"destinations": [{"name": "shop", "colour": 1}]}, "unknown key 'colour'"),
        (
            {"destinations": [{"name": "shop", "faults": [{"status": 200}]}]},
            "faults[0].status: 200 is not an HTTP error status",
        ),
        (
            {"destinations": [{"name": "shop", "faults": [{"status": 500, "down": True}]}]},
            "give exactly one of status, lose_response, timeout, down",
        ),
        ({"admissions": [{"orders": 1, "destinations": ["other"]}]}, "'other' is not one of"),
        ({"crashes": [{"at": 1, "destination": "shop", "after": "lunch"}]}, "write `claim`"),
        ({"admissions": [], "inbound": None}, "expected a mapping"),
        ({"admissions": []}, "nothing happens"),
    ],
)
def test_a_scenario_that_cannot_run_says_where_and_why(tmp_path, change, message):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({**MINIMAL, **change}))

    with pytest.raises(ScenarioError) as caught:
        scenario.load(str(path))

    assert message in str(caught.value) and str(caught.value).startswith("tiny.json: ")


def test_an_unknown_scenario_lists_the_built_in_ones():
    with pytest.raises(ScenarioError, match="no built-in scenario of that name .*flash-sale"):
        scenario.load("flash-sail")


def test_a_file_that_is_not_yaml_says_so(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\n")

    with pytest.raises(ScenarioError, match="broken.yaml: not valid YAML"):
        scenario.load(str(path))


values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=30,
)
keys = st.sampled_from(
    ["name", "duration", "destinations", "admissions", "crashes", "inbound", "beat", "start"]
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys, values, max_size=8) | values)
def test_whatever_a_file_holds_the_reader_answers_with_a_scenario_or_a_scenario_error(data):
    try:
        scenario.parse(data, where="fuzz.yaml")
    except ScenarioError as exc:
        assert str(exc).startswith("fuzz.yaml")
