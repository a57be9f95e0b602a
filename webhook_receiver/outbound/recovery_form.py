"""A recovery job's criteria and rate as a form, for the two pages that plan one: the
admin's (which adds the destination to choose and takes types as text) and the portal's
(on one endpoint, its types ticked from the catalog). Each page adds only its own words;
what a job selects is said here once, beside the service that reads it (recovery.py)."""

from __future__ import annotations

from django import forms
from django.utils.translation import gettext_lazy as _

from .models import RecoveryKind
from .recovery import ANSWER_CLASSES, MIN_RATE, Criteria

# a moment as a browser's own picker enters it, in the current time zone
MOMENT = forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")


class RecoveryCriteriaForm(forms.Form):
    """What a recovery job selects, and its rate; ``event_type_names`` is the page's."""

    kind = forms.ChoiceField(
        label=_("What to send again"), choices=RecoveryKind.choices, initial=RecoveryKind.RECOVER
    )
    since = forms.DateTimeField(label=_("Admitted since"), widget=MOMENT)
    until = forms.DateTimeField(label=_("Admitted before"), widget=MOMENT, required=False)
    answer_classes = forms.MultipleChoiceField(
        label=_("Last answer"),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        choices=[(c, c if c != "none" else _("none (no answer)")) for c in ANSWER_CLASSES],
        help_text=_(
            "None ticked: any. “none”: no answer came (a timeout, a refused connection). "
            "Not for missing messages, which were never answered."
        ),
    )
    ordering_key_prefix = forms.CharField(
        label=_("Ordering key prefix"),
        required=False,
        max_length=255,
        help_text=_("Optional, e.g. order:ord_1042"),
    )
    rate = forms.FloatField(label=_("Rate (messages a second)"), required=False, min_value=MIN_RATE)

    def event_type_names(self) -> list[str]:
        """The types chosen (names or group.* patterns); none: every type."""
        raise NotImplementedError

    def criteria(self) -> Criteria:
        data = self.cleaned_data
        return Criteria(
            kind=data["kind"],
            since=data["since"],
            until=data["until"],
            event_types=self.event_type_names(),
            answer_classes=list(data["answer_classes"]),
            ordering_key_prefix=data["ordering_key_prefix"].strip(),
        )
