"""Ed25519 as RFC 8032 section 5.1 specifies it, in plain Python integers (the algorithm
of the RFC's section 6): an implementation independent of ``cryptography`` and OpenSSL,
so a test that checks the app's signatures with it checks them against the standard.

Slow (a few milliseconds a signature) and not constant-time: for tests only.
"""

from __future__ import annotations

import hashlib

Point = tuple[int, int, int, int]  # extended homogeneous coordinates (X, Y, Z, T)

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493  # the group order


def _inverse(x: int) -> int:
    return pow(x, P - 2, P)


D = -121665 * _inverse(121666) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)


def _sha512_int(data: bytes) -> int:
    return int.from_bytes(hashlib.sha512(data).digest(), "little")


def _add(p1: Point, p2: Point) -> Point:
    a = (p1[1] - p1[0]) * (p2[1] - p2[0]) % P
    b = (p1[1] + p1[0]) * (p2[1] + p2[0]) % P
    c = 2 * p1[3] * p2[3] * D % P
    d = 2 * p1[2] * p2[2] % P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % P, g * h % P, f * g % P, e * h % P)


def _multiply(scalar: int, point: Point) -> Point:
    result: Point = (0, 1, 1, 0)  # the neutral element
    while scalar > 0:
        if scalar & 1:
            result = _add(result, point)
        point = _add(point, point)
        scalar >>= 1
    return result


def _equal(p1: Point, p2: Point) -> bool:
    # x1 / z1 == x2 / z2 and y1 / z1 == y2 / z2, without dividing
    return (p1[0] * p2[2] - p2[0] * p1[2]) % P == 0 and (p1[1] * p2[2] - p2[1] * p1[2]) % P == 0


def _recover_x(y: int, sign: int) -> int | None:
    if y >= P:
        return None
    x2 = (y * y - 1) * _inverse(D * y * y + 1) % P
    if x2 == 0:
        return None if sign else 0
    x = pow(x2, (P + 3) // 8, P)
    if (x * x - x2) % P != 0:
        x = x * SQRT_M1 % P
    if (x * x - x2) % P != 0:
        return None
    if (x & 1) != sign:
        x = P - x
    return x


_BASE_Y = 4 * _inverse(5) % P
_BASE_X = _recover_x(_BASE_Y, 0)
assert _BASE_X is not None
BASE: Point = (_BASE_X, _BASE_Y, 1, _BASE_X * _BASE_Y % P)


def _compress(point: Point) -> bytes:
    z_inverse = _inverse(point[2])
    x, y = point[0] * z_inverse % P, point[1] * z_inverse % P
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


def _decompress(data: bytes) -> Point | None:
    if len(data) != 32:
        return None
    y = int.from_bytes(data, "little")
    sign = y >> 255
    y &= (1 << 255) - 1
    x = _recover_x(y, sign)
    if x is None:
        return None
    return (x, y, 1, x * y % P)


def _expand(seed: bytes) -> tuple[int, bytes]:
    if len(seed) != 32:
        raise ValueError("an Ed25519 seed is 32 bytes")
    digest = hashlib.sha512(seed).digest()
    scalar = int.from_bytes(digest[:32], "little")
    scalar &= (1 << 254) - 8  # clear the three low bits and the top bit
    scalar |= 1 << 254
    return scalar, digest[32:]


def public_key(seed: bytes) -> bytes:
    scalar, _ = _expand(seed)
    return _compress(_multiply(scalar, BASE))


def sign(seed: bytes, message: bytes) -> bytes:
    scalar, prefix = _expand(seed)
    public = _compress(_multiply(scalar, BASE))
    r = _sha512_int(prefix + message) % L
    encoded_r = _compress(_multiply(r, BASE))
    k = _sha512_int(encoded_r + public + message) % L
    return encoded_r + ((r + k * scalar) % L).to_bytes(32, "little")


def verify(public: bytes, message: bytes, signature: bytes) -> bool:
    if len(public) != 32 or len(signature) != 64:
        return False
    a = _decompress(public)
    r = _decompress(signature[:32])
    if a is None or r is None:
        return False
    s = int.from_bytes(signature[32:], "little")
    if s >= L:
        return False
    k = _sha512_int(signature[:32] + public + message) % L
    return _equal(_multiply(s, BASE), _add(r, _multiply(k, a)))
