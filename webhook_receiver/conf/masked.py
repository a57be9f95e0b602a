"""A URL as a person may read it: what could be a credential masked. The lowest place
that every reader of a URL imports (the settings' egress proxy here in conf/, the
admin's, portal's and commands' destinations through presentation/display.py), so that
one rule says what a shown URL hides."""

from __future__ import annotations

MASK = "…"
# user:password (or a token alone) before the host: never shown, not even its user
CREDENTIALS_MASK = "***"


def url_masked(url: str) -> str:
    """A URL as lists, pages and messages show it: the credentials before the host as
    ``***`` (a user alone may be a token), each query value and the fragment as ``…``
    (a merchant's token often rides in the query string), the rest as it is.
    ``https://m.example/hook?token=abc&v=2`` -> ``https://m.example/hook?token=…&v=…``;
    ``http://egress:pw@proxy:4750`` -> ``http://***@proxy:4750``. A change form's input
    keeps the real value for whoever may change it."""
    before_fragment, hash_sign, fragment = url.partition("#")
    base, question_mark, query = before_fragment.partition("?")
    if question_mark:
        base += "?" + "&".join(_masked_pair(pair) for pair in query.split("&"))
    scheme, slashes, rest = base.partition("//")
    if slashes:
        authority, slash, path = rest.partition("/")
        _credentials, at, host = authority.rpartition("@")
        if at:
            authority = f"{CREDENTIALS_MASK}@{host}"
        base = f"{scheme}//{authority}{slash}{path}"
    return base + (f"#{MASK}" if hash_sign and fragment else hash_sign)


def _masked_pair(pair: str) -> str:
    """``name=value`` as ``name=…``; a bare word (``?abc123``, perhaps a token) as ``…``."""
    name, equals, value = pair.partition("=")
    if equals:
        return f"{name}={MASK}" if value else pair
    return MASK if pair else pair
