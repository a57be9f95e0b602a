"""What a key accepts: the readers of conf/keys.py, each checking a value as a host
writes it (in Python, or from an environment variable: a comma-separated string) and
converting it to the settings object's type, with an error that names the key."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from ipaddress import IPv4Network, IPv6Network, ip_address, ip_network
from typing import Any
from urllib.parse import urlsplit

from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

from .egress_proxy import parse_egress_proxy
from .keys import Reader, reader


def at_least_one(convert: Callable[[Any], Any], unit: str = "") -> Reader:
    """A number of at least 1 (of ``unit``, for the docs), converted by ``convert``."""

    def read(value: Any, where: str) -> Any:
        try:
            fits = float(value) >= 1
        except (TypeError, ValueError):
            fits = False
        if not fits:
            raise ImproperlyConfigured(f"{where} must be a number of at least 1, not {value!r}.")
        return convert(value)

    return Reader(f"a number{unit}, at least 1", read)


def more_than_zero(convert: Callable[[Any], Any], unit: str = "") -> Reader:
    """A number greater than 0 (of ``unit``, for the docs), converted by ``convert``."""

    def read(value: Any, where: str) -> Any:
        try:
            fits = float(value) > 0
        except (TypeError, ValueError):
            fits = False
        if not fits:
            raise ImproperlyConfigured(f"{where} must be a number greater than 0, not {value!r}.")
        return convert(value)

    return Reader(f"a number{unit}, greater than 0", read)


def days(value: Any) -> timedelta:
    return timedelta(days=value)


def seconds(value: Any) -> timedelta:
    return timedelta(seconds=value)


@reader("whole milliseconds; `0`: no limit")
def milliseconds(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ImproperlyConfigured(
            f"{where} must be a whole number of milliseconds, 0 for no limit."
        )
    return value


@reader("whole seconds, at least 0")
def whole_seconds(value: Any, where: str) -> timedelta:
    if not isinstance(value, int) or value < 0:
        raise ImproperlyConfigured(f"{where} must be whole seconds, at least 0, not {value!r}.")
    return timedelta(seconds=value)


@reader("a number between 0 and 1, both excluded")
def fraction(value: Any, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if not 0 < number < 1 or isinstance(value, bool):
        raise ImproperlyConfigured(f"{where} must be a fraction between 0 and 1, not {value!r}.")
    return number


@reader("a dotted path, or `None`")
def dotted_path(value: Any, where: str) -> str | None:
    # imported by the system checks (E004) and by the reader of each hook, not here
    return value


@reader("a string, or `None`")
def text_or_none(value: Any, where: str) -> str | None:
    return value or None


@reader("`True` or `False`")
def flag(value: Any, where: str) -> bool:
    return bool(value)


def one_of(*choices: str) -> Reader:
    """One of ``choices``, or ``None``."""
    shown = ", ".join(f'`"{choice}"`' for choice in choices)

    def read(value: Any, where: str) -> str | None:
        if value is None or value in choices:
            return value
        raise ImproperlyConfigured(
            f"{where} must be one of {', '.join(choices)} or None, not {value!r}."
        )

    return Reader(f"{shown} or `None`", read)


@reader("a dict")
def plain_dict(value: Any, where: str) -> dict[Any, Any]:
    return dict(value)


def comma_separated(value: Any) -> list[Any]:
    """A list as a host writes it, or one string of comma-separated items, as an
    environment variable gives it."""
    return value.split(",") if isinstance(value, str) else list(value or ())


# --- readers of one key each -------------------------------------------------------------


@dataclass(frozen=True)
class TrustedProxies:
    """The proxies in front of the app: the nearest ``count`` hops, or the hops whose
    address is in ``networks`` (exactly one of the two is set)."""

    count: int = 0
    networks: tuple[IPv4Network | IPv6Network, ...] = ()

    def trusts(self, hop: int, address: str | None) -> bool:
        """Whether the ``hop``-th nearest peer (0: REMOTE_ADDR), at ``address`` (None: not
        known, as on a Unix socket), is one of them, so that the address it appended to
        X-Forwarded-For can be believed. A count trusts by position alone."""
        if self.count:
            return hop < self.count
        if address is None:
            return False
        ip = ip_address(address)
        return any(ip in network for network in self.networks)


NEW_KEY_HINT = (
    'Generate a key with: python -c "from cryptography.fernet import Fernet; '
    'print(Fernet.generate_key().decode())"'
)


def parse_networks(value: str | Iterable[Any]) -> tuple[IPv4Network | IPv6Network, ...]:
    """Networks from CIDRs (a comma-separated string, as an environment variable gives
    them, or a list); a bare address is a network of one. A malformed one raises
    ValueError naming it."""
    networks = []
    for item in (str(i).strip() for i in comma_separated(value)):
        if not item:
            continue
        try:
            networks.append(ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not a network (CIDR, such as 10.0.0.0/8)") from None
    return tuple(networks)


@reader("a number of proxies, or a list (or comma-separated string) of networks; `None`")
def trusted_proxies(value: Any, where: str) -> TrustedProxies | None:
    """None, 0 or "": none. A whole number (or its digits, as an environment variable
    gives them): that many proxies. Otherwise addresses and networks, as a list or one
    comma-separated string."""
    if value is None or value == 0 or value == "":
        return None
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ImproperlyConfigured(f"{where} must not be negative, not {value!r}.")
        return TrustedProxies(count=value) if value else None
    try:
        networks = parse_networks(value)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(
            f"{where}: the number of proxies in front of the app (1 for nginx alone), or "
            f"their addresses and networks, like ['127.0.0.1', '10.0.0.0/8'] ({exc})."
        ) from exc
    return TrustedProxies(networks=networks) if networks else None


@reader("a list of header names")
def header_names(value: Any, where: str) -> frozenset[str]:
    return frozenset(h.lower() for h in value)


@reader("a list of origins: `https://host` or `https://host:port`")
def origin_list(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(item, str) for item in value):
        raise ImproperlyConfigured(f"{where} must be a list of origins, not {value!r}.")
    for origin in value:
        parts = urlsplit(origin)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or origin != (f"{parts.scheme}://{parts.netloc}")
        ):
            raise ImproperlyConfigured(
                f"{where}: {origin!r} is not an origin (a scheme and a host, an optional "
                "port, nothing after it: https://admin.shop.example)."
            )
    return tuple(value)


@reader("a list of names and dotted paths")
def name_list(value: Any, where: str) -> tuple[str, ...]:
    return tuple(value)


@reader("a number of days, at least 0; `0`: never")
def failing_span(value: Any, where: str) -> timedelta | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if not number >= 0 or isinstance(value, bool):
        raise ImproperlyConfigured(
            f"{where} must be a number of days, at least 0 (0: never), not {value!r}."
        )
    return timedelta(days=number) if number else None


@reader("a list, or a comma-separated string, of Fernet keys")
def fernet_keys(value: Any, where: str) -> tuple[str, ...]:
    """The keys as given. A malformed one is not refused here, which would fail every
    read of the settings (every request, every page): only the secrets it should read
    are unreadable (``core.encryption``), and system check E011 names its position."""
    return tuple(k.strip() for k in comma_separated(value) if isinstance(k, str) and k.strip())


def fernet_key_problem(key: str) -> str | None:
    """Why ``key`` is not a Fernet key, never quoting it; None when it is one."""
    try:
        Fernet(key)
    except (ValueError, TypeError):
        return "is not a Fernet key (32 bytes in url-safe base64)"
    return None


@reader("a list, or a comma-separated string, of CIDRs")
def network_list(value: Any, where: str) -> tuple[IPv4Network | IPv6Network, ...]:
    try:
        return parse_networks(value)
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(f"{where}: {exc}") from exc


proxy_url = Reader("`http://[user:password@]host:port`, or `None`", parse_egress_proxy)
