"""The confirmation page of the destinations' Enable action (admin/destinations.py)."""

from __future__ import annotations

from django.utils.translation import gettext, ngettext_lazy

from .confirm import Confirmation, Selection
from .forms import EnableForm


def _these(count: int) -> str:
    return gettext("this destination") if count == 1 else gettext("these destinations")


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
