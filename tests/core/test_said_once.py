"""logs.SaidOnce: what lasts is said once a stretch, when it starts, and again when it
ends (popped) or, with ``every``, when that long has passed."""

from __future__ import annotations

from webhook_receiver.core.logs import SaidOnce


def test_a_condition_is_said_when_its_stretch_starts_and_counted_while_it_lasts():
    said = SaidOnce()

    assert said.met(now=0.0)
    assert not said.met(now=1.0) and not said.met(now=1e9)
    assert said.stretches[None].repeats == 2

    # when: it ends, its stretch says since when; the next time it is met, it is said
    ended = said.stretches.pop(None)
    assert (ended.since, ended.repeats) == (0.0, 2)
    assert said.met(now=5.0)


def test_with_every_a_lasting_condition_is_said_again_each_time_that_has_passed():
    said = SaidOnce(every=60)

    assert said.met("shop", now=0.0) and said.met("other", now=1.0)
    assert not said.met("shop", now=59.9)
    assert said.met("shop", now=60.0)

    said.clear()
    assert said.met("shop", now=61.0)
