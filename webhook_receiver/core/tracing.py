"""Optional OpenTelemetry spans, one trace from a sender's request to a merchant's.

With ``opentelemetry-api`` installed (the ``otel`` extra) and an SDK configured by the
host, the app makes spans: ``webhook.receive`` (a server span, child of the request's
``traceparent``), ``webhook.verify``, ``webhook.claim`` and ``webhook.handler`` inside
it; ``webhook.relay_round`` linked to the messages it sends, and ``webhook.deliver`` (a
client span) per delivery, child of the span that admitted the message, whose
``traceparent`` goes out with the request. The admitting span's ``traceparent`` is kept
on the outbox message. Without the API, or without an SDK, every call here is a no-op.

Spans carry names, keys, types, counts and status codes only: never a body, a header's
value but ``traceparent``, a secret or a signature, nor an exception's message (which
may quote a payload): a failed span's status names the exception's class.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the otel extra is not installed: nothing to trace with
    trace = None  # type: ignore[assignment]  # the module, or None: the checker sees one

TRACER = "webhook_receiver"
# the carrier's headers a span may read or write: W3C trace context, nothing else (not
# baggage, which a sender fills as it likes)
TRACE_HEADERS = ("traceparent", "tracestate")
MAX_TRACEPARENT = 128

if trace is not None:
    _propagator = TraceContextTextMapPropagator()
    SERVER, CLIENT, INTERNAL = SpanKind.SERVER, SpanKind.CLIENT, SpanKind.INTERNAL
else:
    SERVER = CLIENT = INTERNAL = None
# a provider named in the environment, which the API loads at its first use
_PROVIDER_NAMED = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def _carrier(headers: Mapping[str, str] | None, traceparent: str = "") -> dict[str, str]:
    found = {}
    if headers is not None:
        for name in TRACE_HEADERS:
            value = headers.get(name)
            if isinstance(value, str) and len(value) <= MAX_TRACEPARENT * 4:
                found[name] = value
    if traceparent:
        found["traceparent"] = traceparent
    return found


def _parent(headers: Mapping[str, str] | None, traceparent: str, context: Any) -> Any:
    """The parent context: a carrier's trace context if it holds one, else ``context``
    (a context captured on another thread), else the current one (None)."""
    carrier = _carrier(headers, traceparent)
    if carrier:
        extracted = _propagator.extract(carrier)
        if trace.get_current_span(extracted).get_span_context().is_valid:
            return extracted
    return context


@contextmanager
def span(
    name: str,
    *,
    kind: Any = None,
    headers: Mapping[str, str] | None = None,
    traceparent: str = "",
    context: Any = None,
    links: Iterable[str] = (),
    **attributes: str | int | None,
) -> Iterator[Any]:
    """A span named ``name`` around the block (None without OpenTelemetry). Its parent:
    the trace context in ``headers`` or ``traceparent`` when valid, else ``context``,
    else the current span. ``links``: traceparents this span is linked to."""
    if trace is None or not _configured():
        yield None
        return
    parent = _parent(headers, traceparent, context)
    tracer = trace.get_tracer(TRACER)
    with tracer.start_as_current_span(
        name,
        context=parent,
        kind=kind or INTERNAL,
        links=_links(links),
        attributes=_clean(attributes),
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            current.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


def _configured() -> bool:
    """Whether a host set a tracer provider (an SDK): until then the API's spans would
    record nothing, and cost a delivery tens of microseconds for it. Read from the API's
    global (set once, never unset) and the environment as the process started, not
    through ``get_tracer_provider()``, which looks OTEL_PYTHON_TRACER_PROVIDER up in the
    environment at every call while no provider is set (6% of the relay's CPU at a
    thousand merchants)."""
    if not hasattr(trace, "_TRACER_PROVIDER"):  # an API that keeps it elsewhere
        return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return trace._TRACER_PROVIDER is not None or _PROVIDER_NAMED


def annotate(current: Any, **attributes: str | int | None) -> None:
    """Add attributes to a span ``span()`` yielded (None: nothing to do)."""
    if current is not None:
        current.set_attributes(_clean(attributes))


def current_traceparent() -> str:
    """The current span's W3C ``traceparent``, or "" outside a recording trace."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent", "")[:MAX_TRACEPARENT]


def current_context() -> Any:
    """The current context, to parent spans made on another thread (None without)."""
    return otel_context.get_current() if trace is not None else None


def inject(headers: dict[str, str]) -> None:
    """Add the current span's ``traceparent`` (and ``tracestate``) to outgoing headers."""
    if trace is not None and trace.get_current_span().get_span_context().is_valid:
        _propagator.inject(headers)


def _links(traceparents: Iterable[str]) -> list[Any]:
    found = []
    for value in traceparents:
        if value:
            context = trace.get_current_span(_propagator.extract({"traceparent": value}))
            if context.get_span_context().is_valid:
                found.append(Link(context.get_span_context()))
    return found


def _clean(attributes: Mapping[str, Any]) -> dict[str, str | int]:
    """Attributes named ``a__b`` become ``webhook.a.b``; None values are left out."""
    return {
        "webhook." + name.replace("__", "."): value if isinstance(value, int) else str(value)
        for name, value in attributes.items()
        if value is not None
    }
