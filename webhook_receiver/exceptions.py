"""Errors, classified by what the caller does next.

- ``RejectedRequest``: the request is refused and nothing is stored but its audit
  record. Each subclass carries what its answer needs: the HTTP status the sender gets,
  a stable code (also the audit record's verification result), and whether the detail
  may be shown to the sender.
- ``TransientError``: the work may succeed later; a retry (or the sender) tries again.
- ``PermanentError``: the event can never be applied as it is; it is dead-lettered at
  once for an operator.
- ``NotStored``: neither applied nor captured; the sender is answered 503 and retries.

A class docstring is the default message.
"""

from __future__ import annotations

from typing import Any


class WebhookError(Exception):
    """Webhook processing failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class RejectedRequest(WebhookError):
    """The request was rejected."""

    status_code: int = 400
    code: str = "rejected"
    # 400s say what was wrong with the headers; other refusals say only their code, so
    # that a prober learns nothing more than it must
    show_detail: bool = False


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

    code = "missing_signature_headers"
    show_detail = True


class MalformedSignatureHeaders(RejectedRequest):
    """A signature header is present but cannot be parsed."""

    code = "malformed_signature_headers"
    show_detail = True


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


class NotStored(WebhookError):
    """A verified event could be neither applied nor captured (the database is down or
    refuses writes): nothing was stored, so the sender must keep it and retry."""

    # the answer's error code (a 503), and the reason that metrics and the status count
    # such a request under
    code: str = "temporarily_unavailable"


class TransientError(WebhookError):
    """The event could not be applied now; it may succeed later."""


class PermanentError(WebhookError):
    """The event can never be applied as it is."""


class InvalidPayload(PermanentError):
    """The verified body is not valid JSON or does not match the event's schema."""

    def __init__(self, message: str | None = None, *, fields: dict[str, list[str]] | None = None):
        super().__init__(message)
        # per field (a path: "lines[0].quantity"), its errors as a handler's serializer
        # words them; kept with the failed attempt
        self.fields = fields or {}

    @classmethod
    def from_serializer_errors(cls, errors: Any, *, what: str = "data") -> InvalidPayload:
        """The errors of a DRF serializer (``serializer.errors``, or a ``ValidationError``'s
        ``detail``), flattened to one path per field: the message names every field, on
        one line, so a log line and a list cell show them all."""
        fields = _error_paths(errors)
        return cls(f"{what} is not valid: {_listed(fields)}", fields=fields)


def serializer_errors_text(errors: Any) -> str:
    """A DRF serializer's errors on one line, one path per field: ``lines[1].quantity: …;
    sku: …`` (as ``InvalidPayload.from_serializer_errors`` words them)."""
    return _listed(_error_paths(errors))


def _listed(fields: dict[str, list[str]]) -> str:
    return "; ".join(f"{path}: {' '.join(found)}" for path, found in fields.items())


def _error_paths(errors: Any, path: str = "") -> dict[str, list[str]]:
    """{"lines": [{}, {"quantity": ["…"]}]} -> {"lines[1].quantity": ["…"]}; errors not
    under a field (``non_field_errors``, a list's own) under their parent's path."""
    if isinstance(errors, dict):
        found: dict[str, list[str]] = {}
        for name, nested in errors.items():
            if name in ("non_field_errors", "detail"):
                inner = path
            elif isinstance(name, int):  # a list's item, as DRF keys a nested list's errors
                inner = f"{path}[{name}]"
            else:
                inner = f"{path}.{name}" if path else str(name)
            for key, messages in _error_paths(nested, inner).items():
                found.setdefault(key, []).extend(messages)
        return found
    if isinstance(errors, list):
        if all(isinstance(item, str) for item in errors):
            return {path or "data": [str(item) for item in errors]} if errors else {}
        found = {}
        for index, item in enumerate(errors):
            for key, messages in _error_paths(item, f"{path}[{index}]").items():
                found.setdefault(key, []).extend(messages)
        return found
    return {path or "data": [str(errors)]}


class UnknownBusinessState(PermanentError):
    """The event refers to business state this system does not know."""
