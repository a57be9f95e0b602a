"""The portal's forms: an endpoint (its URL, words, subscriptions and filter), a test
event, a secret's rotation, a recovery's plan, and the message log's filter.

Each form checks what a browser can get wrong (a field's shape: JSON, a date, a choice);
what only the services know (the egress guard on the URL, the catalog on the
subscriptions, a recovery's horizon and rate) they say when they refuse, and the views
add it to the form, by field (``add_problems``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from django import forms
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from ..outbound.endpoints import (
    DESCRIPTION_MAX_CHARS,
    URL_MAX_CHARS,
    EndpointFields,
    EndpointRefused,
    endpoint_checked,
    offered_catalog,
)
from ..outbound.models import MessageStatus, RecoveryKind
from ..outbound.recovery_form import MOMENT, RecoveryCriteriaForm

# how long a rotated secret keeps signing beside the new one
OVERLAPS = (
    (0, _("None: the old secret stops signing now")),
    (3600, _("1 hour")),
    (86400, _("24 hours")),
    (604800, _("7 days")),
)
DEFAULT_OVERLAP = 86400


def group_patterns() -> list[str]:
    """A ``group.*`` pattern per catalog group that reaches a type (an opt-in type never
    falls under a pattern: a group of opt-in types only has none)."""
    return sorted({f"{e.group}.*" for e in offered_catalog() if "." in e.name and not e.opt_in})


def subscription_choices(current: Iterable[str] = ()) -> list[tuple[str, str]]:
    """Every subscription an endpoint may hold: the group patterns, the catalog's types,
    and what it holds already (a type the catalog no longer declares stays choosable, so
    that saving the form does not drop it unasked)."""
    offered = [*group_patterns(), *(e.name for e in offered_catalog())]
    extra = [c for c in current if c not in offered]
    return [(value, value) for value in (*offered, *extra)]


def add_problems(form: forms.Form, problems: Mapping[str, str]) -> None:
    """A service's refusal, field by field (a field the form lacks: the whole form's)."""
    for name, why in problems.items():
        form.add_error(name if name in form.fields else None, why)


class PortalForm(forms.Form):
    """The portal's forms: labels without Django's trailing colon."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)


class EndpointForm(PortalForm):
    """An endpoint as its owner sets it. ``checked()`` is the service's own check (the
    egress guard on the URL, the catalog, the filter's rules)."""

    url = forms.CharField(
        label=_("URL"),
        max_length=URL_MAX_CHARS,
        widget=forms.URLInput(attrs={"autocomplete": "url", "spellcheck": "false"}),
        help_text=_(
            "Where the webhooks are sent: an http or https address your server answers on. "
            "Private and internal addresses are refused."
        ),
    )
    description = forms.CharField(
        label=_("Description"),
        max_length=DESCRIPTION_MAX_CHARS,
        required=False,
        help_text=_("Your own words for it, e.g. “Production order sync”."),
    )
    event_types = forms.MultipleChoiceField(
        label=_("Event types"),
        required=False,
        widget=forms.CheckboxSelectMultiple,
    )
    filter = forms.CharField(
        label=_("Filter (JSON)"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false", "class": "mono"}),
        help_text=_(
            'Optional: which events it is sent, e.g. {"data.status": "paid"}. '
            "Keys: type, data.<field>, metadata.<field>; operators $eq, $neq, $in, $nin, "
            "$startsWith, $exist; $and and $or take a list. Empty: every event it "
            "subscribes to."
        ),
    )

    def __init__(self, *args: Any, current: Iterable[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["event_types"]
        assert isinstance(field, forms.MultipleChoiceField)
        field.choices = subscription_choices(current)

    def clean_filter(self) -> Any:
        text = self.cleaned_data["filter"].strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(
                gettext("This is not JSON: %(why)s") % {"why": exc}
            ) from None

    def selected(self) -> list[str]:
        """The subscriptions ticked now (posted, or the endpoint's own)."""
        value = self["event_types"].value()
        return [str(v) for v in value] if isinstance(value, list | tuple) else []

    def checked(self) -> tuple[EndpointFields, str] | None:
        """The fields as the service checks them, and the URL's warning; None, with the
        service's reasons on the form's fields, when it refuses them."""
        data = self.cleaned_data
        try:
            return endpoint_checked(
                data["url"], data["event_types"], data["filter"], data["description"]
            )
        except EndpointRefused as refused:
            add_problems(self, refused.problems)
            return None

    @staticmethod
    def initial_of(endpoint: Any) -> dict[str, Any]:
        return {
            "url": endpoint.url,
            "description": endpoint.description,
            "event_types": list(endpoint.event_types or []),
            "filter": "" if endpoint.filter is None else json.dumps(endpoint.filter, indent=2),
        }


class TestEventForm(PortalForm):
    """A catalog type with an example, sent once to one endpoint."""

    event_type = forms.ChoiceField(
        label=_("Event type"),
        help_text=_(
            "Its data is the catalog's example; its key starts with “test:”, so your "
            "server can tell it from a live event."
        ),
    )

    def __init__(self, *args: Any, subscribed: Iterable[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        wanted = set(subscribed)
        with_example = [e.name for e in offered_catalog() if e.example is not None]
        # the types the endpoint subscribes to first
        ordered = sorted(with_example, key=lambda name: (name not in wanted, name))
        field = self.fields["event_type"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [(name, name) for name in ordered]
        if ordered and not self.is_bound:
            self.initial.setdefault("event_type", ordered[0])


class SecretRotateForm(PortalForm):
    overlap = forms.TypedChoiceField(
        label=_("Old secret keeps signing for"),
        choices=OVERLAPS,
        coerce=int,
        initial=DEFAULT_OVERLAP,
        widget=forms.RadioSelect,
        help_text=_(
            "During the overlap every request carries a signature by each secret: switch "
            "your server to the new one before it ends."
        ),
    )

    def overlap_span(self) -> timedelta:
        return timedelta(seconds=self.cleaned_data["overlap"])


class RecoveryForm(PortalForm, RecoveryCriteriaForm):
    """What a recovery job selects among an endpoint's messages, and its rate."""

    kind = forms.ChoiceField(
        label=_("What to send again"),
        choices=RecoveryKind.choices,
        initial=RecoveryKind.RECOVER,
        widget=forms.RadioSelect,
    )
    event_types = forms.MultipleChoiceField(
        label=_("Event types"),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text=_("None ticked: every type."),
    )
    field_order = ["kind", "since", "until", "event_types"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["event_types"]
        assert isinstance(field, forms.MultipleChoiceField)
        field.choices = subscription_choices()
        zone = timezone.get_current_timezone_name()
        self.fields["since"].help_text = gettext(
            "In %(zone)s. Nothing older than the endpoint's replay horizon."
        ) % {"zone": zone}
        self.fields["until"].help_text = gettext("In %(zone)s. Empty: up to now.") % {"zone": zone}
        self.fields["rate"].help_text = gettext(
            "Below the endpoint's own, so that live traffic keeps its share. Empty: half."
        )

    def event_type_names(self) -> list[str]:
        return list(self.cleaned_data["event_types"])


class MessageFilterForm(PortalForm):
    """The message log's narrowing (a GET form: every field optional)."""

    endpoint = forms.TypedChoiceField(
        label=_("Endpoint"), required=False, coerce=int, empty_value=None
    )
    event_type = forms.CharField(
        label=_("Event type"),
        required=False,
        max_length=255,
        widget=forms.TextInput(attrs={"list": "catalog-types", "spellcheck": "false"}),
    )
    status = forms.ChoiceField(label=_("State"), required=False)
    since = forms.DateTimeField(label=_("Admitted since"), required=False, widget=MOMENT)
    until = forms.DateTimeField(label=_("Admitted before"), required=False, widget=MOMENT)

    def __init__(
        self, *args: Any, endpoints: Iterable[tuple[int, str]] = (), **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["endpoint"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = [("", gettext("any")), *((str(pk), name) for pk, name in endpoints)]
        # "Failed", of "Failed (terminal: for an operator)", in the request's language
        state = self.fields["status"]
        assert isinstance(state, forms.ChoiceField)
        state.choices = [("", gettext("any"))] + [
            (s.value, str(s.label).split(" (")[0]) for s in MessageStatus
        ]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        since, until = data.get("since"), data.get("until")
        if since and until and until <= since:
            self.add_error("until", gettext("The end must come after the start."))
        return data

    def narrowing(self) -> dict[str, Any]:
        """actions.messages' keywords for what was asked."""
        data = self.cleaned_data
        return {
            "endpoint": data.get("endpoint"),
            "event_type": (data.get("event_type") or "").strip(),
            "status": data.get("status") or "",
            "since": data.get("since"),
            "until": data.get("until"),
        }
