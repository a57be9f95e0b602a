"""The confirmation pages of the destinations' actions (admin/destinations.py): Recover
since… and Enable."""

from __future__ import annotations

from django.utils.translation import gettext, ngettext_lazy

from .confirm import Confirmation, Selection
from .forms import EnableForm, RecoverForm


def _these(count: int) -> str:
    return gettext("this destination") if count == 1 else gettext("these destinations")


def recover_confirmation(count: int) -> Confirmation:
    these = _these(count)
    return Confirmation(
        action="recover_since_selected",
        title=gettext("Recover failed messages"),
        explanation=(
            gettext(
                "Once a merchant has fixed its endpoint: every failed message of %(these)s "
                "whose last attempt started at or after the time below is sent again, oldest "
                "first, under its own key. Each gets the whole retry policy again (its failures "
                "go back to 0). Failed messages from before that time stay failed. An open "
                "breaker is ended: the destination goes half-open at once, and its first "
                "answer decides."
            )
            % {"these": these},
        ),
        form=RecoverForm,
        submit=ngettext_lazy(
            "Recover %(count)d destination's failed messages",
            "Recover %(count)d destinations' failed messages",
            "count",
        ),
        selection=Selection(
            (
                gettext("destination"),
                gettext("enabled"),
                gettext("failed now"),
                gettext("last success"),
                gettext("last failure"),
            ),
            lambda dest: (
                dest.name,
                gettext("yes") if dest.enabled else gettext("no (it sends nothing until enabled)"),
                dest.failed_count,
                dest.last_success_at or gettext("never"),
                dest.last_failure_at or gettext("never"),
            ),
        ),
    )


def enable_confirmation(count: int) -> Confirmation:
    these = _these(count)
    return Confirmation(
        action="enable_selected",
        title=gettext("Enable destinations"),
        explanation=(
            gettext(
                "Once %(these)s can take messages again: each disabled one is enabled, and "
                "the messages it held are sent as its limits allow, oldest first and each "
                "ordering key in turn, under their own keys. The reason the relay disabled "
                "it (a 410 Gone, or too long with no success) is cleared, and so is an open "
                "breaker. One already enabled is left as it is; to give up on held messages "
                "instead, discard them."
            )
            % {"these": these},
        ),
        form=EnableForm,
        submit=ngettext_lazy(
            "Enable %(count)d destination", "Enable %(count)d destinations", "count"
        ),
        selection=Selection(
            (gettext("destination"), gettext("state"), gettext("held")),
            lambda dest: (
                dest.name,
                gettext("enabled")
                if dest.enabled
                else dest.disabled_reason or gettext("disabled by an operator"),
                dest.backlog,
            ),
            status_column=1,
        ),
    )
