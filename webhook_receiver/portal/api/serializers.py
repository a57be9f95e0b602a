"""What the portal's JSON API reads and answers. Every field is named here: no serializer
reads a model's fields wholesale, so none ever answers a secret (``secrets``,
``retiring_secrets``), the limiter's state (``tokens``), what the relay could not record
(``record_error``), a message's metadata, or who on the host's staff acted. An answer's
text (what a merchant's server said) is given only to a session that may read it
(``context["readable"]``: actions.may_read_answers), its size to every one. Times are
ISO 8601, whatever the host's ``REST_FRAMEWORK`` says.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import ISO_8601, serializers

from ...outbound.endpoints import LONGEST_OVERLAP
from ...outbound.models import MessageStatus, RecoveryKind
from ...outbound.recovery import ANSWER_CLASSES, Criteria, sent_counts
from .base import Json, Text

# a bulk retry's ids, at most; one type's name, at most (the message's column)
RETRY_MAX_IDS = 1000
NAME_MAX_CHARS = 255
SUBSCRIPTIONS_MAX = 100
BIGINT_MAX = 2**63 - 1


def when(**options: Any) -> serializers.DateTimeField:
    """A time, ISO 8601 in and out."""
    return serializers.DateTimeField(format=ISO_8601, input_formats=[ISO_8601], **options)


def size_of(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


# --- answers ------------------------------------------------------------------------------


class PortalSessionSerializer(serializers.Serializer):
    session = serializers.CharField(
        help_text="The session's key: send it as `Authorization: Bearer KEY`. Shown once."
    )
    expires_at = when()
    tenant = serializers.CharField()
    capabilities = serializers.ListField(child=serializers.CharField())


class PortalHealthSerializer(serializers.Serializer):
    backlog = serializers.IntegerField(help_text="Messages pending or being sent.")
    failed_count = serializers.IntegerField(help_text="Messages that failed for good.")
    in_flight = serializers.IntegerField(help_text="Requests in flight now.")
    held_back = serializers.IntegerField(
        help_text="Messages waiting behind a failed one of their ordering key."
    )
    oldest_eligible_at = when(
        allow_null=True, help_text="When the oldest message sendable now was admitted."
    )
    oldest_due_at = when(allow_null=True, help_text="Since when something is due to be sent.")


class PortalLimitsSerializer(serializers.Serializer):
    rate_count = serializers.IntegerField()
    rate_seconds = serializers.FloatField()
    burst = serializers.IntegerField()
    max_in_flight = serializers.IntegerField()
    timeout_seconds = serializers.FloatField()
    max_attempts = serializers.IntegerField()
    replay_horizon_days = serializers.IntegerField()


class PortalEndpointSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    description = serializers.CharField()
    url = serializers.CharField()
    event_types = serializers.ListField(
        child=serializers.CharField(), help_text="Event types by name, and `group.*` patterns."
    )
    filter = serializers.JSONField(allow_null=True, help_text="Which events it is sent.")
    enabled = serializers.BooleanField()
    disabled_reason = serializers.CharField(
        help_text="Why the relay disabled it (410 Gone, failing too long); empty otherwise."
    )
    disabled_at = when(allow_null=True)
    breaker_open_until = when(
        source="paused_until", allow_null=True, help_text="Paused after failures until then."
    )
    last_success_at = when(allow_null=True)
    last_failure_at = when(allow_null=True)
    failing_since = when(allow_null=True)
    old_secrets_sign_until = when(
        source="retiring_until",
        allow_null=True,
        help_text="After a rotation, the old secrets sign beside the new one until then.",
    )
    created_at = when()
    updated_at = when()
    limits = PortalLimitsSerializer(source="*")
    health = PortalHealthSerializer(source="*")


class PortalEndpointChangedSerializer(PortalEndpointSerializer):
    warning = serializers.CharField(
        help_text="Empty, or why the URL's name does not resolve now (it is saved anyway)."
    )


class PortalEndpointCreatedSerializer(PortalEndpointChangedSerializer):
    secret = serializers.CharField(
        help_text="The endpoint's signing secret: given here once, and never again."
    )


class PortalEndpointSwitchSerializer(serializers.Serializer):
    changed = serializers.BooleanField(help_text="False when it already was.")
    endpoint = PortalEndpointSerializer()


class PortalPublicKeysSerializer(serializers.Serializer):
    signing = serializers.IntegerField(help_text="How many secrets sign its requests now.")
    public_keys = serializers.ListField(
        child=serializers.CharField(), help_text="The `v1a` public keys (`whpk_…`) to verify."
    )


class PortalRotatedSerializer(serializers.Serializer):
    secret = serializers.CharField(help_text="The new secret: given here once, never again.")
    old_secrets_sign_until = when(
        allow_null=True, help_text="Until when the old secrets sign too (null: no longer)."
    )


class PortalAdmissionSerializer(serializers.Serializer):
    endpoint_name = serializers.CharField(source="destination")
    key = serializers.CharField()
    created = serializers.BooleanField()
    filtered = serializers.BooleanField(
        help_text="Left out by the endpoint's filter: written discarded, never sent."
    )


class _Answers(serializers.Serializer):
    # what reads context["readable"] (no docstring: the document would show it)

    @property
    def readable(self) -> bool:
        return bool(self.context.get("readable", False))


class PortalAttemptSerializer(_Answers):
    """One HTTP attempt of a message, and what it was answered."""

    number = serializers.IntegerField()
    started_at = when()
    duration_ms = serializers.IntegerField()
    status_code = serializers.IntegerField(allow_null=True)
    error = serializers.CharField(help_text="Why there was no answer (a connection's error).")
    answer = serializers.SerializerMethodField(
        help_text="The answer's start; null for a session that may not manage endpoints."
    )
    answer_bytes = serializers.SerializerMethodField()
    next_attempt_at = when(allow_null=True)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_answer(self, attempt: Any) -> str | None:
        return attempt.response_excerpt if self.readable else None

    @extend_schema_field(serializers.IntegerField())
    def get_answer_bytes(self, attempt: Any) -> int:
        return size_of(attempt.response_excerpt)


class PortalMessageSerializer(_Answers):
    """One delivery of an event to an endpoint."""

    id = serializers.IntegerField()
    endpoint = serializers.IntegerField(source="destination_id")
    endpoint_name = serializers.CharField(source="destination.name")
    key = serializers.CharField()
    event_type = serializers.CharField()
    status = serializers.ChoiceField(choices=MessageStatus.choices)
    ordering_key = serializers.CharField()
    attempt_count = serializers.IntegerField(source="attempts")
    failures = serializers.IntegerField()
    created_at = when()
    next_attempt_at = when()
    delivered_at = when(allow_null=True)
    last_status_code = serializers.IntegerField(allow_null=True)
    last_answer = serializers.SerializerMethodField(
        help_text="The last answer (or why none came); its text is null for a session that "
        "may not manage endpoints."
    )
    last_answer_bytes = serializers.SerializerMethodField()
    discarded_at = when(allow_null=True)
    discard_reason = serializers.CharField()
    recovery_job = serializers.IntegerField(source="recovery_id", allow_null=True)

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_last_answer(self, message: Any) -> str | None:
        # without a status code, it is the relay's own account (a connection's error)
        if self.readable or message.last_status_code is None:
            return str(message.last_error)
        return None

    @extend_schema_field(serializers.IntegerField())
    def get_last_answer_bytes(self, message: Any) -> int:
        return size_of(message.last_error)


class PortalMessageDetailSerializer(PortalMessageSerializer):
    """One delivery of an event to an endpoint, its body and its newest attempts."""

    payload = serializers.JSONField(help_text="The body as sent.")
    attempts = PortalAttemptSerializer(
        source="shown_attempts", many=True, help_text="The newest attempts (100 at most)."
    )


class PortalRetriedSerializer(serializers.Serializer):
    retried = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="The messages made pending now (failed or pending ones; others are as "
        "they were).",
    )


class PortalSampleSerializer(serializers.Serializer):
    key = serializers.CharField()
    event_type = serializers.CharField()
    created_at = when()


class PortalPlanSerializer(serializers.Serializer):
    endpoint_name = serializers.CharField()
    count = serializers.IntegerField(help_text="How many messages a job would send.")
    sample = PortalSampleSerializer(many=True)
    matched_types = serializers.ListField(child=serializers.CharField(), allow_null=True)
    rate = serializers.FloatField(help_text="Messages a second.")
    duration_seconds = serializers.FloatField(help_text="How long it takes at that rate.")
    warnings = serializers.ListField(child=serializers.CharField())


class PortalJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    endpoint = serializers.IntegerField(source="destination_id")
    endpoint_name = serializers.CharField(source="destination.name")
    kind = serializers.ChoiceField(choices=RecoveryKind.choices)
    state = serializers.CharField()
    since = when()
    until = when(allow_null=True)
    event_types = serializers.ListField(child=serializers.CharField())
    answer_classes = serializers.ListField(child=serializers.CharField())
    ordering_key_prefix = serializers.CharField()
    rate = serializers.FloatField()
    planned = serializers.IntegerField()
    released = serializers.IntegerField()
    progress = serializers.SerializerMethodField()
    sent = serializers.SerializerMethodField()
    created_at = when()
    finished_at = when(allow_null=True)

    @extend_schema_field(serializers.FloatField(help_text="Released of planned, 0 to 1."))
    def get_progress(self, job: Any) -> float:
        return 1.0 if not job.planned else min(1.0, job.released / job.planned)

    @extend_schema_field(
        serializers.DictField(
            child=serializers.IntegerField(),
            help_text="Its released messages by their status now.",
        )
    )
    def get_sent(self, job: Any) -> dict[str, int]:
        return sent_counts(job)


class PortalJobSwitchSerializer(serializers.Serializer):
    changed = serializers.BooleanField(help_text="False when it was not running.")
    job = PortalJobSerializer()


class PortalEventTypeSerializer(serializers.Serializer):
    name = serializers.CharField()
    group = serializers.CharField()
    version = serializers.IntegerField()
    description = serializers.CharField()
    deprecated = serializers.BooleanField()
    opt_in = serializers.BooleanField(help_text="Reached by its name only, never by `group.*`.")
    example = serializers.JSONField(allow_null=True, help_text="An example of its `data`.")
    schema = serializers.CharField(
        allow_null=True, help_text="Its schema in the OpenAPI document (null: not served)."
    )


class PortalCatalogSerializer(serializers.Serializer):
    document = serializers.CharField(
        allow_null=True, help_text="The OpenAPI 3.1 document's address (null: not served)."
    )
    event_types = PortalEventTypeSerializer(many=True)


# --- requests -----------------------------------------------------------------------------


class PortalExchangeSerializer(serializers.Serializer):
    token = serializers.CharField(
        allow_blank=True, trim_whitespace=False, help_text="The token in a link's fragment."
    )


class PortalEndpointInSerializer(serializers.Serializer):
    url = Text(allow_blank=True, help_text="http(s), where the endpoint listens.")
    description = Text(required=False, allow_blank=True, default="")
    event_types = serializers.ListField(
        child=Text(max_length=NAME_MAX_CHARS),
        required=False,
        default=list,
        max_length=SUBSCRIPTIONS_MAX,
        help_text="Event types by name, and `group.*` patterns (none: nothing is sent).",
    )
    filter = Json(
        required=False,
        allow_null=True,
        default=None,
        help_text="Which of those events it is sent (null: every one).",
    )


class PortalRotateSerializer(serializers.Serializer):
    overlap_seconds = serializers.IntegerField(
        min_value=0,
        max_value=int(LONGEST_OVERLAP.total_seconds()),
        help_text="How long the old secrets keep signing beside the new one (0: not at all).",
    )


class PortalTestSerializer(serializers.Serializer):
    event_type = Text(max_length=NAME_MAX_CHARS, help_text="A catalog type: its example is sent.")


class PortalCriteriaSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=RecoveryKind.choices)
    since = when(help_text="Messages admitted from then (within the replay horizon).")
    until = when(required=False, allow_null=True, default=None)
    event_types = serializers.ListField(
        child=Text(max_length=NAME_MAX_CHARS),
        required=False,
        default=list,
        max_length=SUBSCRIPTIONS_MAX,
        help_text="Names and `group.*` patterns (none: every type).",
    )
    answer_classes = serializers.ListField(
        child=serializers.ChoiceField(choices=ANSWER_CLASSES),
        required=False,
        default=list,
        help_text="The last answer's class (none: any).",
    )
    ordering_key_prefix = Text(
        required=False, allow_blank=True, default="", trim_whitespace=False, max_length=255
    )
    rate = serializers.FloatField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Messages a second, below the endpoint's own (null: half of it).",
    )

    def criteria(self) -> Criteria:
        data = self.validated_data
        until: datetime | None = data["until"]
        return Criteria(
            kind=data["kind"],
            since=data["since"],
            until=until,
            event_types=tuple(data["event_types"]),
            answer_classes=tuple(data["answer_classes"]),
            ordering_key_prefix=data["ordering_key_prefix"],
        )


class PortalJobStartSerializer(PortalCriteriaSerializer):
    endpoint = serializers.IntegerField(min_value=1, max_value=BIGINT_MAX)


class PortalRetrySerializer(serializers.Serializer):
    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=BIGINT_MAX),
        allow_empty=False,
        max_length=RETRY_MAX_IDS,
        help_text="Messages of the tenant's: if one is not, nothing is retried (404).",
    )


class PortalMessageFilterSerializer(serializers.Serializer):
    endpoint = serializers.IntegerField(required=False, min_value=1, max_value=BIGINT_MAX)
    event_type = Text(required=False, max_length=NAME_MAX_CHARS)
    status = serializers.ChoiceField(required=False, choices=MessageStatus.choices)
    since = when(required=False, help_text="Admitted at or after (ISO 8601).")
    until = when(required=False, help_text="Admitted before (ISO 8601).")


class PortalJobFilterSerializer(serializers.Serializer):
    endpoint = serializers.IntegerField(required=False, min_value=1, max_value=BIGINT_MAX)
