"""The admin's pages as the test client sees them: the actions a list offers, the
messages a request flashed, an object's page and buttons, an action posted."""

from __future__ import annotations

from django.contrib.messages import get_messages
from django.urls import reverse


def filter_case_id(value) -> str:
    """A filter case's id, the same in every test process (pytest-xdist compares them): a
    set of expected keys is named in sorted order, not in its hash order."""
    return str(sorted(value)) if isinstance(value, set) else str(value)


def action_values(response) -> set[str]:
    """The actions the list's action form offers ("" is its blank choice); none: no form."""
    form = response.context["action_form"]
    return set() if form is None else {value for value, _ in form.fields["action"].choices}


def flash(response) -> list[tuple[int, str]]:
    """The messages the request left for the next page, as (level, text)."""
    return [(m.level, m.message) for m in get_messages(response.wsgi_request)]


def change_url(row) -> str:
    opts = type(row)._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[row.pk])


def button_url(row, name: str) -> str:
    """The URL of one of the page's buttons (``retry``, ``discard``, ``replay``, …)."""
    opts = type(row)._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_{name}", args=[row.pk])


def act(client, changelist: str, action: str, *rows, **confirmation):
    """The action's first post (from the list), or with ``confirmation`` the
    confirmation page's post."""
    client.cookies.pop("messages", None)  # each post's messages are its own
    data = {"action": action, "_selected_action": [r.pk for r in rows]}
    if confirmation:
        data |= {"post": "yes", **confirmation}
    else:
        data["index"] = 0
    return client.post(changelist, data)
