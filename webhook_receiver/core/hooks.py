"""The host's hooks named in settings by dotted path (a notifier, a state comparison):
loaded one way, with an error that names the setting when the path is wrong."""

from __future__ import annotations

from typing import TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

T = TypeVar("T")


def hook_class(path: str, base: type[T], *, setting: str, expected: str) -> type[T]:
    """The subclass of ``base`` at the dotted ``path``. Raises ``ImproperlyConfigured``,
    naming ``setting``, when it cannot be imported or is not ``expected`` (a few words:
    "a StateComparison subclass")."""
    found: object = None
    if "." in path:
        try:
            found = import_string(path)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"WEBHOOK_RECEIVER[{setting!r}]: {path!r} cannot be imported ({exc})."
            ) from exc
    if not (isinstance(found, type) and issubclass(found, base)):
        raise ImproperlyConfigured(f"WEBHOOK_RECEIVER[{setting!r}]: {path!r} is not {expected}.")
    return found
