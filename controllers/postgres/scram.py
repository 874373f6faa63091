"""SCRAM-SHA-256 password verifiers, computed on the client (RFC 5802/7677, as PostgreSQL
stores them in ``pg_authid.rolpassword``).

The operator sends ``ALTER ROLE ... PASSWORD 'SCRAM-SHA-256$...'``: PostgreSQL stores a
pre-hashed verifier as is, so the plain password never travels to the server and never shows
in its statement log (``psql``'s ``\\password`` does the same). And a stored verifier can be
checked against the desired password without changing it (:func:`verify`), so an existing
role is converged without rewriting its password on every reconcile.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

ITERATIONS = 4096
"""PostgreSQL's default ``scram_iterations``."""
PREFIX = "SCRAM-SHA-256$"


def _keys(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    # PostgreSQL applies SASLprep; our generated passwords are ASCII, where it is the
    # identity. Other passwords are used as UTF-8 unchanged (still valid, as PG falls back
    # to the raw bytes when SASLprep fails).
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    return stored_key, server_key


def verifier(password: str, *, salt: bytes | None = None, iterations: int = ITERATIONS) -> str:
    """The verifier PostgreSQL would store for ``password`` (a fresh 16-byte salt unless
    given)."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    stored_key, server_key = _keys(password, salt, iterations)
    b64 = base64.b64encode
    return (
        f"{PREFIX}{iterations}:{b64(salt).decode()}"
        f"${b64(stored_key).decode()}:{b64(server_key).decode()}"
    )


def verify(stored: str | None, password: str) -> bool:
    """Whether ``stored`` (a ``rolpassword`` value) is a SCRAM verifier of ``password``.
    ``False`` for anything else (no password, MD5, malformed)."""
    if not stored or not stored.startswith(PREFIX):
        return False
    try:
        head, keys = stored[len(PREFIX) :].split("$", 1)
        iterations_text, salt_text = head.split(":", 1)
        stored_key_text, server_key_text = keys.split(":", 1)
        salt = base64.b64decode(salt_text, validate=True)
        stored_key, server_key = _keys(password, salt, int(iterations_text))
    except ValueError:
        return False
    return hmac.compare_digest(
        base64.b64encode(stored_key).decode(), stored_key_text
    ) and hmac.compare_digest(base64.b64encode(server_key).decode(), server_key_text)


def generate_password(length: int = 32) -> str:
    """A random password of ``length`` URL-safe characters (no quoting needed in a URI)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(length))
