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
        (
            {"crashes": [{"at": 1, "destination": "shop", "after": "lunch"}]},
            "crashes[0].after: 'lunch': write 'claim' or 'send'",
        ),
        (
            {"admissions": [], "inbound": 5},
            "inbound: expected a mapping of keys to values, got int",
        ),
        ({"admissions": []}, "nothing happens"),
        ({"name": None}, "tiny.json: name: expected text, got nothing"),
        ({"duration": None, "name": ""}, "tiny.json: name: expected text, got str ''"),
        ({"admissions": [{}]}, "tiny.json: admissions[0].orders: required, and missing"),
        ({"admissions": [{"orders": 1.5}]}, "admissions[0].orders: expected a whole number, got"),
        ({"admissions": [{"orders": 1, "ordering": "yes"}]}, "ordering: expected true or false"),
        ({"admissions": [{"orders": 1, "events": []}]}, "admissions[0].events: give at least 1"),
        (
            {"admissions": [{"orders": 1, "repeat": [{"share": 2, "after": 1}]}]},
            "admissions[0].repeat[0].share: expected at most 1, got 2",
        ),
        ({"destinations": {"name": "shop"}}, "tiny.json: destinations: expected a list, got dict"),
        (
            {"destinations": [{"name": "shop", "faults": [{"down": True, "colour": "red"}]}]},
            "destinations[0].faults[0]: unknown key 'colour' (known: attempts, delay, down, "
            "events, from, group, lose_response, retry_after, share, slow, status, timeout, "
            "until)",
        ),
        (
            {"inbound": {"events": 1, "duplicates": {"share": 0.1, "later": 1}}},
            "inbound.duplicates: unknown key 'later' (known: after, share)",
        ),
        (
            {"inbound": {"events": 1, "silent": [{"from": "5m", "until": "1m"}]}},
            "inbound.silent[0]: `until` must come after `from`",
        ),
        (
            {"destinations": [{"name": "shop", "faults": [{"timeout": True, "delay": 1}]}]},
            "destinations[0].faults[0].delay: a timeout takes no delay of its own",
        ),
        (
            {"destinations": [{"name": "shop", "faults": [{"down": "yes"}]}]},
            "destinations[0].faults[0].down: write it as `true`",
        ),
        ({"destinations": [{"name": "shop"}, {"name": "shop"}]}, "destinations: two destinations"),
        ({"isolated": ["elsewhere"]}, "isolated: 'elsewhere' is not one of the destinations"),
        ({"start": "monday"}, "start: 'monday': write an ISO 8601 time with its offset"),
        ({"path": "/etc/passwd"}, "tiny.json: unknown key 'path' (known: admissions, beat,"),
    ],
)
def test_a_scenario_that_cannot_run_says_where_and_why(tmp_path, change, message):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({**MINIMAL, **change}))

    with pytest.raises(ScenarioError) as caught:
        scenario.load(str(path))

    assert message in str(caught.value) and str(caught.value).startswith("tiny.json: ")


@pytest.mark.parametrize(
    ("recovery", "message"),
    [
        ({"at": "5m", "kind": "replay"}, "recovery.kind: a run simulates no replay job"),
        ({"at": "5m", "kind": "redo"}, "recovery.kind: 'redo': write `recover`"),
        ({"at": "5m", "since": "6m"}, "recovery.since: must come before `at`"),
        ({"at": "5m", "since": "1m", "until": "1m"}, "recovery.until: must come after `since`"),
        (
            {"at": "5m", "rate": "20/2s"},
            "recovery.rate: 10/s: write a rate below the destination's own (10/s)",
        ),
        ({"at": "5m", "answers": ["6xx"]}, "recovery.answers: '6xx': one of 2xx"),
        ({"at": "5m", "after": "1m"}, "recovery: unknown key 'after' (known: answers, at, events,"),
        ({"at": "20m"}, "recovery.at: +00:20:00 is past the run's end (+00:10:00)"),
    ],
)
def test_a_recovery_that_cannot_run_says_where_and_why(recovery, message):
    shop = {"name": "shop", "rate": "10/s", "recovery": recovery}
    data = {**MINIMAL, "duration": "10m", "destinations": [{"name": "other"}, shop]}

    with pytest.raises(ScenarioError) as caught:
        scenario.parse(data, where="ops.yaml")

    assert str(caught.value).startswith(f"ops.yaml: destinations[1].{message}")


def test_a_yaml_file_with_a_mistake_names_the_file_the_place_and_what_to_write(tmp_path):
    path = tmp_path / "black-friday.yaml"
    path.write_text(
        "name: black-friday\nduration: 2h\ndestinations:\n  - name: a\n  - name: b\n"
        "    rate: 5 per s\nadmissions: [{orders: 10}]\n"
    )

    with pytest.raises(ScenarioError) as caught:
        scenario.load(str(path))

    assert str(caught.value) == (
        "black-friday.yaml: destinations[1].rate: '5 per s' is not a rate: write "
        "count/duration (5/s, 300/1m)"
    )


def test_the_files_words_read_into_the_runs_inputs():
    loaded = scenario.parse(
        {
            **MINIMAL,
            "destinations": [
                {
                    "name": "shop",
                    "rate": "300/1m",
                    "timeout": "5s",
                    "breaker_cooldown": "2m",
                    "faults": [{"slow": "30s", "from": "1m", "until": "2m"}, {"status": 503}],
                }
            ],
            "admissions": [{"orders": 2, "repeat": [{"share": 0.5, "after": "30s"}]}],
            "inbound": {"events": 3, "duplicates": {"share": 0.2}, "late": {"by": "1m"}},
        },
        path="shop.yaml",
    )

    shop, (slow, status) = loaded.destinations[0], loaded.destinations[0].faults
    assert (shop.rate_count, shop.rate_seconds, shop.timeout_seconds) == (300, 60.0, 5.0)
    assert shop.breaker_cooldown_seconds == 120 and shop.delay_seconds == 0
    assert (slow.kind, slow.delay, slow.applies_at(59), slow.applies_at(60)) == (
        "slow",
        30.0,
        False,
        True,
    )
    assert (status.kind, status.status, status.delay, status.applies_at(10**8)) == (
        "status",
        503,
        None,
        True,
    )
    assert loaded.admissions[0].repeats[0].after == 30 and loaded.admissions[0].events == ("paid",)
    assert (loaded.inbound.duplicates.share, loaded.inbound.duplicates.after) == (0.2, 30.0)
    assert (loaded.inbound.late.share, loaded.inbound.late.by) == (0.0, 60.0)
    assert loaded.path == "shop.yaml" and loaded.only(("shop",)).path == "shop.yaml"


def test_an_empty_optional_key_reads_as_a_key_not_given():
    loaded = scenario.parse({**MINIMAL, "start": None, "inbound": None})

    assert loaded.start == scenario.parse(MINIMAL).start and loaded.inbound is None


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
