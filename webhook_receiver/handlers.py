"""The receive side's public face: what a host imports to register its handlers.

    from webhook_receiver.handlers import HandlerResult, WebhookEvent, webhook_handler

The registry itself lives in ``inbound/handlers.py``, which says how handlers are
registered, chosen and validated.
"""

from __future__ import annotations

from .inbound import handlers as _registry
from .inbound.handlers import *  # noqa: F403 (the registry's public names, by its __all__)

__all__ = _registry.__all__
