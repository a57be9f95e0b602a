"""The outbox's destinations: configuration, added and changed here (or with ``manage.py
webhook_destination``), never deleted (disable one instead), listed with their health,
recovered with **Recover…** (a recovery job: admin/recovery_jobs.py) once a merchant
has fixed its endpoint or missed events, and
enabled again with **Enable** (an action, and a button on a disabled one's page, behind
the change permission), which sends the messages it held in their order: one the relay
disabled (a 410 Gone, a long failing span: outbound/retirement.py) shows why. Their
secrets are never shown: the list counts them, the form (admin/forms.py) lets you keep
or drop each (known by its last four characters) and add new ones. The public keys of
its Ed25519 signing keys are shown, for the merchant to verify ``v1a`` signatures with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import mark_safe
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from ..core.encryption import secrets_unreadable, with_stored_secrets
from ..outbound.breaker import destination_breaker
from ..outbound.models import MessageStatus, OutboxMessage, RecoveryJob, WebhookDestination
from ..outbound.operations import destination_disable, destination_enable
from ..outbound.selectors import destinations_with_health
from ..outbound.tenancy import EVERY_TENANT
from ..presentation.admin_links import admin_url
from ..presentation.display import duration_text, url_masked
from ..schemes.standard_keys import public_keys_of
from .base import ObjectButton, ObjectButtons
from .cells import compact_time, full_time, moment_cell
from .confirm import confirm_then_act
from .destination_actions import enable_confirmation
from .forms import DestinationForm

if TYPE_CHECKING:
    from ..outbound.selectors import DestinationWithHealth


@dataclass(frozen=True)
class BreakerShown:
    """The breaker as an operator reads it: its state, a few words under it in the list
    (with a title), and the sentence of the destination's page."""

    state: str
    css: str = ""
    under: str = ""
    title: str = ""
    sentence: str = ""

    @classmethod
    def of(cls, dest: WebhookDestination) -> BreakerShown:
        breaker = destination_breaker(dest)
        failures = breaker.consecutive_failures
        if breaker.state == "open" and breaker.until is not None:
            return cls(
                gettext("open"),
                "wr-open",
                gettext("until %(time)s") % {"time": compact_time(breaker.until)},
                full_time(breaker.until),
                gettext(
                    "open until %(time)s, after %(failures)d consecutive failures; then one "
                    "probe decides"
                )
                % {"time": full_time(breaker.until), "failures": failures},
            )
        if breaker.state == "half-open":
            return cls(
                gettext("half-open"),
                "wr-half",
                gettext("one probe at a time"),
                sentence=gettext("half-open: one probe at a time decides whether it closes"),
            )
        if failures:
            in_a_row = ngettext("%d failure in a row", "%d failures in a row", failures) % failures
            return cls(
                gettext("closed"),
                under=in_a_row,
                sentence=gettext(
                    "closed (%(failures)d consecutive failures; it opens at %(threshold)d)"
                )
                % {"failures": failures, "threshold": dest.breaker_threshold},
            )
        return cls(gettext("closed"), sentence=gettext("closed"))


@dataclass(frozen=True)
class EnableButton(ObjectButton):
    """Enable: on a disabled destination's page only."""

    def applies_to(self, obj: Any) -> bool:
        return not obj.enabled


# the configuration an admin form saves; the limiter's and breaker's state, which the
# relay writes under the row's lock meanwhile, is never written back from a form, nor
# is ``enabled`` (changed through destination_enable and destination_disable, which
# resume or hold its messages and clear the relay's reason)
CONFIGURATION = tuple(
    f for f in (*DestinationForm.Meta.fields, "secrets", "updated_at") if f != "enabled"
)


@admin.register(WebhookDestination)
class WebhookDestinationAdmin(ObjectButtons, admin.ModelAdmin):
    """Destinations with their health; add, change, disable; recover…"""

    # "Recover…" on a destination's page: the list action on that one destination
    object_buttons = {
        "recover": ObjectButton("recover_selected", None, _("recovered"), _("Recover…")),
        "enable": EnableButton("enable_selected", None, _("enabled"), _("Enable")),
    }
    object_noun = _("destination")

    form = DestinationForm
    list_display = (
        "destination",
        "enabled",
        "breaker",
        "backlog_figure",
        "oldest_eligible",
        "failed_figure",
        "last_success",
        "last_failure",
        "secret_count",
    )
    list_display_links = None
    # a platform's thousands of tenants: found by name, not listed in a sidebar
    search_fields = ("name", "tenant")
    actions = ["recover_selected", "enable_selected"]
    health_fields = (
        "disabled_state",
        "breaker_state",
        "backlog_figure",
        "oldest_eligible",
        "failed_figure",
        "last_success_exactly",
        "last_failure_exactly",
    )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> list[tuple]:
        fields: tuple[str, ...] = ("new_secrets", "generate_signing_key")
        if obj is not None:
            fields = ("public_keys", "keep_secrets", *fields)
        secrets: dict[str, Any] = {"fields": fields}
        unreadable = secrets_unreadable(obj)
        if unreadable is not None:
            secrets["description"] = format_html(
                '<strong class="wr-failed">{}</strong>. {}',
                unreadable.state,
                gettext(
                    "Nothing is sent to this destination until they are replaced: add new "
                    "secrets (and give them to the merchant), or put back the key they "
                    "were encrypted with."
                ),
            )
        # the input keeps the real URL for whoever may change it; others read it masked
        url = "url" if self.has_change_permission(request, obj) else "url_shown"
        # the health first: what an operator opens this page for
        fieldsets: list[tuple] = [(_("Health"), {"fields": self.health_fields})] if obj else []
        fieldsets += [
            (
                _("Destination"),
                {"fields": ("name", "tenant", url, "enabled", "event_types", "filter")},
            ),
            (_("Secrets"), secrets),
            (
                _("Limits"),
                {
                    "fields": (
                        ("rate_count", "rate_seconds", "burst"),
                        "max_in_flight",
                        "timeout_seconds",
                    )
                },
            ),
            (
                _("Retries"),
                {
                    "fields": (
                        "max_attempts",
                        ("backoff_base_seconds", "backoff_cap_seconds"),
                        "retry_after_cap_seconds",
                        "replay_horizon_days",
                    )
                },
            ),
            (_("Breaker"), {"fields": (("breaker_threshold", "breaker_cooldown_seconds"),)}),
        ]
        return fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # the name is how host code enqueues to it (enqueue_webhook("merchant-7", …))
        return ("name", "public_keys", *self.health_fields) if obj is not None else ()

    def get_queryset(self, request: HttpRequest) -> QuerySet[WebhookDestination]:
        # the secrets as stored: a row no key decrypts is shown as such, not a 500
        return destinations_with_health(with_stored_secrets(super().get_queryset(request)))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # its messages are kept (PROTECT): a destination is disabled, not deleted
        return False

    def has_recover_permission(self, request: HttpRequest) -> bool:
        """Recovering starts a recovery job: the jobs' add permission."""
        return request.user.has_perm(f"{self.opts.app_label}.add_recoveryjob")

    def save_model(self, request: HttpRequest, obj: Any, form: forms.Form, change: bool) -> None:
        warning = getattr(form, "url_warning", "")
        if warning:  # a name that does not resolve yet: saved, the guard holds at send
            self.message_user(request, f"{obj.name}: {warning}", messages.WARNING)
        if not change:
            obj.save()
            return
        obj.save(update_fields=CONFIGURATION)
        if "enabled" in getattr(form, "changed_data", ()):
            by = request.user.get_username()
            if obj.enabled:
                destination_enable(scope=EVERY_TENANT, destination=obj, by=by)
            else:
                destination_disable(scope=EVERY_TENANT, destination=obj, by=by)

    # --- the list ------------------------------------------------------------------------

    @admin.display(description=_("destination"), ordering="name")
    def destination(self, obj: WebhookDestination) -> str:
        return format_html(
            '<a href="{}" class="wr-key">{}</a><span class="wr-under" title="{}">{}</span>',
            admin_url(WebhookDestination, "change", quote(obj.pk)),
            obj.name,
            url_masked(obj.url),
            url_masked(obj.url),
        )

    @admin.display(description=_("breaker"), ordering="paused_until")
    def breaker(self, obj: WebhookDestination) -> str:
        shown = BreakerShown.of(obj)
        if not shown.under:
            return shown.state
        return format_html(
            '<span class="{}">{}</span><span class="wr-under"{}>{}</span>',
            f"wr-line {shown.css}".strip(),
            shown.state,
            format_html(' title="{}"', shown.title) if shown.title else "",
            shown.under,
        )

    @admin.display(description=_("backlog"), ordering="backlog")
    def backlog_figure(self, obj: DestinationWithHealth) -> str:
        return self._messages_link(obj, obj.backlog, MessageStatus.PENDING, "wr-figure")

    @admin.display(description=_("oldest due"), ordering="oldest_eligible_at")
    def oldest_eligible(self, obj: DestinationWithHealth) -> str:
        if obj.oldest_eligible_at is None:
            return "-"
        return format_html(
            '<span title="{}">{}</span>',
            gettext("waiting since %(time)s") % {"time": full_time(obj.oldest_eligible_at)},
            duration_text(timezone.now() - obj.oldest_eligible_at),
        )

    @admin.display(description=_("failed"), ordering="failed_count")
    def failed_figure(self, obj: DestinationWithHealth) -> str:
        css = "wr-figure wr-failed" if obj.failed_count else "wr-figure"
        return self._messages_link(obj, obj.failed_count, MessageStatus.FAILED, css)

    @admin.display(description=_("last success"), ordering="last_success_at")
    def last_success(self, obj: WebhookDestination) -> str:
        return moment_cell(obj.last_success_at, gettext("never"))

    @admin.display(description=_("last failure"), ordering="last_failure_at")
    def last_failure(self, obj: WebhookDestination) -> str:
        return moment_cell(obj.last_failure_at, gettext("never"))

    @admin.display(description=_("secrets"))
    def secret_count(self, obj: WebhookDestination) -> str:
        unreadable = secrets_unreadable(obj)
        if unreadable is not None:
            return format_html('<span class="wr-failed">{}</span>', unreadable.state)
        count = len(getattr(obj, "stored_secrets", None) or [])
        return ngettext("%d secret", "%d secrets", count) % count

    def _messages_link(self, obj: WebhookDestination, count: int, status: str, css: str) -> str:
        filters: dict[str, int | str] = {"destination__id__exact": obj.pk, "status__exact": status}
        query = urlencode(filters)
        return format_html(
            '<a class="{}" href="{}?{}">{}</a>',
            css,
            admin_url(OutboxMessage),
            query,
            count,
        )

    # --- the change form -----------------------------------------------------------------

    @admin.display(description=_("URL"))
    def url_shown(self, obj: WebhookDestination) -> str:
        return url_masked(obj.url)

    @admin.display(description=_("state"))
    def disabled_state(self, obj: WebhookDestination) -> str:
        if obj.enabled:
            return gettext("enabled")
        since = full_time(obj.disabled_at) if obj.disabled_at else gettext("unknown")
        if obj.disabled_reason:
            return gettext(
                "disabled by the relay since %(time)s: %(reason)s; its messages are held "
                "until it is enabled"
            ) % {"time": since, "reason": obj.disabled_reason}
        return gettext("disabled since %(time)s; its messages are held until it is enabled") % {
            "time": since
        }

    @admin.display(description=_("Public keys"))
    def public_keys(self, obj: WebhookDestination) -> str:
        """What the merchant verifies ``v1a`` signatures with: public, so shown whole (the
        signing keys they come from never are)."""
        unreadable = secrets_unreadable(obj)
        if unreadable is not None:
            # a signing key no configured key decrypts has no public key to show
            return unreadable.state
        keys = public_keys_of(obj.secrets or [])
        if not keys:
            return gettext("None: it has no signing key (whsk_), only shared secrets.")
        return format_html_join(
            mark_safe("<br>"), '<code class="wr-public-key">{}</code>', ((k,) for k in keys)
        )

    @admin.display(description=_("breaker"))
    def breaker_state(self, obj: WebhookDestination) -> str:
        return BreakerShown.of(obj).sentence

    @admin.display(description=_("last success"))
    def last_success_exactly(self, obj: WebhookDestination) -> str:
        return full_time(obj.last_success_at) if obj.last_success_at else gettext("never")

    @admin.display(description=_("last failure"))
    def last_failure_exactly(self, obj: WebhookDestination) -> str:
        return full_time(obj.last_failure_at) if obj.last_failure_at else gettext("never")

    # --- Recover… ------------------------------------------------------------------------

    def has_custom_permission(self, request: HttpRequest, action: str) -> bool:
        """ObjectButtons' check: Recover… (the jobs' add permission), Enable (change)."""
        if action == "enable":
            return self.has_change_permission(request)
        return action == "recover" and self.has_recover_permission(request)

    def object_status_text(self, obj: Any) -> str:
        return gettext("enabled") if obj.enabled else gettext("disabled")

    # --- Enable ----------------------------------------------------------------------------

    @admin.action(description=_("Enable (send the messages they hold)…"), permissions=["change"])
    def enable_selected(
        self, request: HttpRequest, queryset: QuerySet[WebhookDestination]
    ) -> TemplateResponse | None:
        selected = list(queryset.order_by("name"))
        confirmation = enable_confirmation(len(selected))
        return confirm_then_act(self, request, selected, confirmation, self._enable)

    def _enable(
        self, request: HttpRequest, selected: list[WebhookDestination], reason: str
    ) -> None:
        by = request.user.get_username()
        for dest in selected:
            held = destination_enable(scope=EVERY_TENANT, destination=dest, by=by)
            if held is None:
                self.message_user(
                    request,
                    gettext("%(name)s was enabled already.") % {"name": dest.name},
                    messages.WARNING,
                )
                continue
            note = ngettext(
                "Enabled: %(count)d held message to send, in its order.",
                "Enabled: %(count)d held messages to send, in their order.",
                held,
            ) % {"count": held}
            self.log_change(request, dest, f"{note} {reason}".strip())
            self.message_user(request, f"{dest.name}: {note}", messages.SUCCESS)

    @admin.action(description=_("Recover… (plan a recovery job)"), permissions=["recover"])
    def recover_selected(
        self, request: HttpRequest, queryset: QuerySet[WebhookDestination]
    ) -> HttpResponse | None:
        """The plan page of a recovery job (admin/recovery_jobs.py), for one destination."""
        selected = list(queryset.values_list("pk", flat=True)[:2])
        if len(selected) != 1:
            text = gettext("A recovery job is planned for one destination: select one.")
            self.message_user(request, text, messages.WARNING)
            return None
        return HttpResponseRedirect(admin_url(RecoveryJob, "add", destination=selected[0]) or "")
