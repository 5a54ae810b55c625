"""The handshake every collie connection starts with.

Both ends send a magic string, whether they hold a token, and a fresh random
nonce. With a token (COLLIE_TOKEN or token=), each end then proves it knows
it by sending HMAC-SHA256(token, role + peer's nonce + own nonce), and tells
the other whether the other's proof was right. The token itself never crosses
the wire, and a recorded exchange cannot be replayed (the nonces differ each
time). Without a token on either end, only the magic is checked, which still
turns a stray connection (a port scanner, a wrong port) into a clear error.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket

from .errors import AuthError

MAGIC = b"COLLIE\x00\x01"
_NONCE = 16


def token_from_env(token: str | bytes | None = None) -> bytes | None:
    """The token given, else $COLLIE_TOKEN, else None (no authentication)."""
    if token is None:
        token = os.environ.get("COLLIE_TOKEN") or None
    if isinstance(token, str):
        token = token.encode()
    return token or None


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly n bytes or raise ConnectionError on end of stream."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("connection closed during the handshake")
        got += k
    return bytes(buf)


def _proof(token: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(token, role + first + second, hashlib.sha256).digest()


def handshake(sock: socket.socket, token: bytes | None, *, server: bool, what: str) -> None:
    """Run the handshake on a connected socket; raise AuthError when the
    other end is refused or refuses us, ConnectionError when it hangs up.

    ``what`` names the connection in error messages ("store at host:port",
    "rank 3"...).
    """
    nonce = os.urandom(_NONCE)
    sock.sendall(MAGIC + (b"\x01" if token else b"\x00") + nonce)
    # A connection that closes before an answer is not a refusal (refusals
    # are said explicitly): ConnectionError, which callers may retry.
    hello = recv_exact(sock, len(MAGIC) + 1 + _NONCE)
    if hello[: len(MAGIC)] != MAGIC:
        raise AuthError(f"{what} is not a collie peer (bad handshake magic)")
    peer_has_token = hello[len(MAGIC)] == 1
    peer_nonce = hello[len(MAGIC) + 1:]
    if bool(token) != peer_has_token:
        if token:
            raise AuthError(f"{what} has no token but this process requires one "
                            "(set the same COLLIE_TOKEN on every rank)")
        raise AuthError(f"{what} requires a token and this process has none "
                        "(set the same COLLIE_TOKEN on every rank)")
    if not token:
        return
    mine, theirs = (b"S", b"C") if server else (b"C", b"S")
    sock.sendall(_proof(token, mine, peer_nonce, nonce))
    try:
        proof = recv_exact(sock, 32)
        ok = hmac.compare_digest(proof, _proof(token, theirs, nonce, peer_nonce))
        sock.sendall(b"\x01" if ok else b"\x00")
        accepted = recv_exact(sock, 1) == b"\x01"
    except OSError as exc:
        raise ConnectionError(f"connection to {what} closed during the token check: {exc}") from exc
    if not ok:
        raise AuthError(f"{what} did not prove it knows the token: refused "
                        "(COLLIE_TOKEN differs between ranks?)")
    if not accepted:
        raise AuthError(f"{what} refused this process's token (COLLIE_TOKEN differs between ranks?)")
