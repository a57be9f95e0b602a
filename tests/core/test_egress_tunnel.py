"""The egress proxy at the level of peer_http's clients: EGRESS_PROXY parsed (its
credentials never shown), a CONNECT tunnel through a real proxy on loopback to a real
server (plain HTTP, and TLS inside the tunnel), and whatever the proxy answers to
CONNECT ending as a response or a clear error within the request's deadline."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.connect_proxy import DENY, DROP, HANG, RAW, connect_proxy
from webhook_receiver.conf.egress_proxy import EgressProxy, parse_egress_proxy
from webhook_receiver.network import peer_http
from webhook_receiver.network.egress import EgressGuard, EgressRefused
from webhook_receiver.network.egress_tunnel import (
    MAX_ANSWER_BYTES,
    EgressProxyRefused,
    parse_answer,
)

PASSWORD = "s3cr3t-pa55"
# how messages name the setting (app_settings passes it; here, the parser alone)
WHERE = "WEBHOOK_RECEIVER['EGRESS_PROXY']"

# --- the setting -------------------------------------------------------------------------


def test_the_setting_parses_into_a_value_that_never_shows_the_password():
    proxy = parse_egress_proxy(f"http://egress:{PASSWORD}@proxy.internal:4750", WHERE)

    assert proxy is not None
    assert (proxy.host, proxy.port) == ("proxy.internal", 4750)
    assert proxy.authorization == "Basic ZWdyZXNzOnMzY3IzdC1wYTU1"  # egress:s3cr3t-pa55
    for shown in (str(proxy), repr(proxy), f"{proxy}", f"{proxy!r}"):
        assert PASSWORD not in shown and "ZWdyZXNz" not in shown
    assert str(proxy) == "http://***@proxy.internal:4750"
    assert str(parse_egress_proxy("http://[fd00::1]:3128", WHERE)) == "http://[fd00::1]:3128"
    assert parse_egress_proxy(None, WHERE) is None and parse_egress_proxy("", WHERE) is None


@pytest.mark.parametrize(
    "value",
    [
        f"https://u:{PASSWORD}@proxy:443",
        f"http://u:{PASSWORD}@proxy",
        f"http://u:{PASSWORD}@proxy:99999",
        f"http://u:{PASSWORD}@proxy:4750/path",
        f"socks5://u:{PASSWORD}@proxy:1080",
        f"u:{PASSWORD}@proxy:4750",
        4750,
    ],
)
def test_a_bad_setting_is_a_configuration_error_that_does_not_repeat_the_url(settings, value):
    from webhook_receiver.conf import app_settings

    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "EGRESS_PROXY": value}
    with pytest.raises(ImproperlyConfigured) as error:
        app_settings()
    assert str(error.value).startswith("WEBHOOK_RECEIVER['EGRESS_PROXY'] ")
    assert PASSWORD not in str(error.value)


def test_app_settings_reads_it(settings):
    from webhook_receiver.conf import app_settings

    settings.WEBHOOK_RECEIVER = {**settings.WEBHOOK_RECEIVER, "EGRESS_PROXY": "http://p:1"}
    assert app_settings().egress_proxy == EgressProxy("p", 1, "http://p:1")


# --- real servers --------------------------------------------------------------------------


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = b"hello " + self.path.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@contextmanager
def merchant(tls: ssl.SSLContext | None = None) -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _self_signed() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context for ``localhost`` and a client context that trusts only it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with tempfile.NamedTemporaryFile(suffix=".pem") as certfile:
        certfile.write(pem + key_pem)
        certfile.flush()
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(certfile.name)
    client = ssl.create_default_context(cadata=pem.decode())
    return server, client


def proxy_of(url: str) -> EgressProxy:
    proxy = parse_egress_proxy(url, WHERE)
    assert proxy is not None
    return proxy


def test_a_plain_http_request_goes_through_the_tunnel_with_the_credentials():
    with merchant() as port, connect_proxy(credentials=("egress", PASSWORD)) as proxy:
        http = peer_http.client(timeout=5, proxy=proxy_of(proxy.url(f"egress:{PASSWORD}")))
        with http, peer_http.deadline(5):
            response = http.get(f"http://localhost:{port}/orders")

    assert response.status_code == 200 and response.content == b"hello /orders"
    # named to the proxy by host name (the proxy resolves it), with the credentials
    [connect] = proxy.connects
    assert connect.target == f"localhost:{port}"
    assert connect.headers["proxy-authorization"] == "Basic ZWdyZXNzOnMzY3IzdC1wYTU1"
    assert connect.headers["host"] == f"localhost:{port}"


def test_tls_is_made_inside_the_tunnel_and_verified_for_the_destination():
    server_tls, client_tls = _self_signed()
    with merchant(server_tls) as port, connect_proxy() as proxy:
        http = peer_http.client(timeout=5, verify=client_tls, proxy=proxy_of(proxy.url()))
        with http, peer_http.deadline(5):
            response = http.get(f"https://localhost:{port}/tls")
        # a client that does not trust the merchant's certificate: the tunnel opens, TLS fails
        stranger = peer_http.client(timeout=5, proxy=proxy_of(proxy.url()))
        with stranger, peer_http.deadline(5), pytest.raises(httpx.ConnectError):
            stranger.get(f"https://localhost:{port}/tls")

    assert response.content == b"hello /tls"
    assert proxy.targets() == [f"localhost:{port}", f"localhost:{port}"]


def test_a_refusal_is_egress_proxy_refused_with_the_proxys_reason():
    with connect_proxy(mode=DENY) as proxy:
        http = peer_http.client(timeout=5, proxy=proxy_of(proxy.url()))
        with http, peer_http.deadline(5), pytest.raises(EgressProxyRefused) as refused:
            http.get("https://merchant.example:8443/")

    assert isinstance(refused.value, httpx.ProxyError)
    assert str(refused.value) == (
        f"refused by the egress proxy http://127.0.0.1:{proxy.port}: CONNECT "
        "merchant.example:8443: HTTP 407 Request Rejected by Proxy: Egress proxy rejected "
        "connection to merchant.example:8443: denied by rule"
    )


def test_wrong_credentials_are_a_refusal_that_does_not_show_them():
    with connect_proxy(credentials=("egress", "the-right-one")) as proxy:
        http = peer_http.client(timeout=5, proxy=proxy_of(proxy.url(f"egress:{PASSWORD}")))
        with http, peer_http.deadline(5), pytest.raises(EgressProxyRefused) as refused:
            http.get("http://merchant.example/")
    assert "HTTP 407 Proxy Authentication Required" in str(refused.value)
    assert PASSWORD not in str(refused.value) and "***@" in str(refused.value)


def test_an_ip_literal_is_still_checked_by_the_guard_and_a_name_is_left_to_the_proxy():
    with merchant() as port, connect_proxy() as proxy:
        http = peer_http.client(timeout=5, guard=EgressGuard(), proxy=proxy_of(proxy.url()))
        with http, peer_http.deadline(5):
            with pytest.raises(EgressRefused):
                http.get(f"http://127.1:{port}/")
            # the proxy resolves localhost: the local guard does not (the trade-off)
            assert http.get(f"http://localhost:{port}/").status_code == 200
    assert proxy.targets() == [f"localhost:{port}"]


@pytest.mark.parametrize(
    ("mode", "error"),
    [(HANG, httpx.ConnectTimeout), (DROP, httpx.ProxyError)],
)
def test_a_silent_or_dropping_proxy_is_a_transient_error_by_the_deadline(mode, error):
    with connect_proxy(mode=mode) as proxy:
        http = peer_http.client(timeout=30, proxy=proxy_of(proxy.url()))
        began = time.monotonic()
        with http, peer_http.deadline(0.8), pytest.raises(error) as raised:
            http.get("http://merchant.example/")
        took = time.monotonic() - began

    assert not isinstance(raised.value, EgressProxyRefused)
    assert "egress proxy" in str(raised.value)
    assert took < 2, took


def test_a_proxy_that_trickles_its_answer_is_cut_at_the_deadline():
    # a byte every 0.1 s: no read waits long, and the answer would take 10 s
    slow = b"HTTP/1.1 200 Connection established\r\nX-Pad: " + b"a" * 100 + b"\r\n\r\n"
    with connect_proxy(mode=RAW, raw=slow, trickle=0.1) as proxy:
        http = peer_http.client(timeout=30, proxy=proxy_of(proxy.url()))
        began = time.monotonic()
        with http, peer_http.deadline(0.8), pytest.raises(httpx.ConnectTimeout) as raised:
            http.get("http://merchant.example/")
        took = time.monotonic() - began
    assert took < 1.5, took
    assert "did not answer CONNECT merchant.example:80 in time" in str(raised.value)


def test_no_proxy_listening_is_a_transient_proxy_error():
    with connect_proxy() as proxy:
        url = proxy.url()
    http = peer_http.client(timeout=5, proxy=proxy_of(url))
    with http, peer_http.deadline(5), pytest.raises(httpx.ProxyError) as raised:
        http.get("http://merchant.example/")
    assert not isinstance(raised.value, EgressProxyRefused)
    assert "no connection to the egress proxy" in str(raised.value)


def test_a_proxy_answer_that_never_ends_is_cut_at_its_cap():
    flood = b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * (4 * MAX_ANSWER_BYTES)
    with connect_proxy(mode=RAW, raw=flood, close_after_raw=False) as proxy:
        http = peer_http.client(timeout=5, proxy=proxy_of(proxy.url()))
        with http, peer_http.deadline(5), pytest.raises(httpx.ProxyError) as raised:
            http.get("http://merchant.example/")
    assert f"runs past {MAX_ANSWER_BYTES} bytes" in str(raised.value)


# --- whatever the proxy answers ------------------------------------------------------------

STATUS_LINES = st.one_of(
    st.builds(
        lambda status, reason: f"HTTP/1.1 {status} {reason}".encode(),
        st.integers(100, 599),
        st.text(max_size=40),
    ).map(lambda b: b.decode().encode("utf-8", "surrogatepass")),
    st.binary(max_size=60),
)
HEADER_LINES = st.lists(
    st.one_of(
        st.sampled_from([b"Content-Length: 5", b"Content-Length: -1", b"Content-Length: 9" * 30]),
        st.binary(max_size=40).filter(lambda b: b"\n" not in b),
    ),
    max_size=4,
)
ANSWERS = st.builds(
    lambda status, headers, end, rest: b"\r\n".join([status, *headers]) + end + rest,
    STATUS_LINES,
    HEADER_LINES,
    st.sampled_from([b"\r\n\r\n", b"\n\n", b"\r\n", b""]),
    st.binary(max_size=30),
)


@settings(max_examples=500, deadline=None)
@given(ANSWERS)
def test_any_answer_parses_or_is_refused_as_no_http_answer(data):
    try:
        answer = parse_answer(data)
    except ValueError:
        return
    assert 100 <= answer.status <= 999
    assert answer.reason.isprintable() and len(answer.reason) <= 200
    assert all(v.isprintable() for v in answer.headers.values())


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=ANSWERS, close=st.booleans())
def test_whatever_a_proxy_answers_the_request_ends_by_its_deadline_with_a_clear_error(data, close):
    with connect_proxy(mode=RAW, raw=data, close_after_raw=close) as proxy:
        http = peer_http.client(timeout=5, proxy=proxy_of(proxy.url()))
        began = time.monotonic()
        try:
            with http, peer_http.deadline(0.4):
                http.get("http://merchant.example/")
        except httpx.HTTPError as exc:
            assert str(exc).strip()
            if isinstance(exc, EgressProxyRefused):
                assert exc.status in (403, 407)
        took = time.monotonic() - began
    # a 2xx with nothing after it opens a "tunnel" to the proxy itself, whose silence
    # is then the destination's: a read timeout, by the same deadline
    assert took < 1.5, took
    assert len(proxy.connects) == 1  # one CONNECT: no loop, no retry inside the client
