"""Errors, classified by what the caller does next.

- ``RejectedRequest``: the request is refused before anything is stored but its audit
  record; each subclass carries its HTTP status and a stable error code.
- ``TransientError``: the work may succeed later; the sender (or a retry) tries again.
- ``PermanentError``: the event can never be applied as it is; an operator must look.

A class docstring is the default message.
"""

from __future__ import annotations

from typing import Any


class WebhookError(Exception):
    """Webhook processing failed."""

    status_code: int = 500
    code: str = "error"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class RejectedRequest(WebhookError):
    """The request was rejected."""

    status_code = 400
    code = "rejected"


class UnknownSource(RejectedRequest):
    """No webhook source is configured under this slug."""

    status_code = 404
    code = "unknown_source"


class PayloadTooLarge(RejectedRequest):
    """The request body is larger than this source accepts."""

    status_code = 413
    code = "payload_too_large"


class MissingSignatureHeaders(RejectedRequest):
    """A header the signature scheme requires is missing."""

    status_code = 400
    code = "missing_signature_headers"


class MalformedSignatureHeaders(RejectedRequest):
    """A signature header is present but cannot be parsed."""

    status_code = 400
    code = "malformed_signature_headers"


class InvalidSignature(RejectedRequest):
    """No presented signature matches any configured secret."""

    status_code = 401
    code = "invalid_signature"


class TimestampOutOfTolerance(RejectedRequest):
    """The signature timestamp is too old or too far in the future."""

    status_code = 401
    code = "timestamp_out_of_tolerance"

    def __init__(self, message: str | None = None, *, verified: Any = None) -> None:
        super().__init__(message)
        # the VerifiedMessage: the signature matched, only its time is wrong
        self.verified = verified


class TransientError(WebhookError):
    """The event could not be applied now; it may succeed later."""

    status_code = 503
    code = "temporarily_unavailable"


class PermanentError(WebhookError):
    """The event can never be applied as it is."""

    status_code = 422
    code = "unprocessable"


class InvalidPayload(PermanentError):
    """The verified body is not valid JSON or does not match the event's schema."""

    code = "invalid_payload"


class UnknownBusinessState(PermanentError):
    """The event refers to business state this system does not know."""

    code = "unknown_business_state"
