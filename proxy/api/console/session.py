"""Console sessions: a signed cookie an admin key opens, and the CSRF tokens bound to it.

Stateless, so every worker of ``--workers`` (one shared admin port) reads any worker's cookie:
``<admin id>.<expires>.<nonce>.<mac>``, the MAC an HMAC-SHA256 under a secret derived from the
admin key itself. A login always mints a new nonce (a cookie planted before login is never
promoted: no session fixation); removing the key from ``--admin-keys`` ends its sessions; the key
is never in the cookie, a URL or a page. A form's CSRF token is an HMAC of the session's nonce:
valid for that session only. Before login, the login form's token is a random value also set
as a ``SameSite=Strict`` cookie (double submit): a cross-site form cannot send both.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Collection
from dataclasses import dataclass

SESSION_COOKIE = "cogproxy_console"
LOGIN_COOKIE = "cogproxy_console_login"
SESSION_TTL_S = 8 * 3600
"""A working day; after it the reviewer logs in again (a stolen cookie is worth as long)."""
LOGIN_TTL_S = 600
"""How long a login form stays usable."""
CSRF_FIELD = "csrf"
_SESSION_LABEL = b"cogproxy review console session v1"
_NONCE_BYTES = 18
_COOKIE_MAX = 256
"""A real cookie is ~110 characters; anything longer is refused unparsed."""


def admin_id(key: str) -> str:
    """How the audit names an admin key (keys carry no names): ``admin-`` and 12 hex digits of
    its SHA-256, never the key."""
    return "admin-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def _secret(key: str) -> bytes:
    return hmac.new(key.encode(), _SESSION_LABEL, hashlib.sha256).digest()


def _mac(secret: bytes, message: str) -> str:
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    """A logged-in reviewer."""

    admin: str
    """``admin_id`` of the key that opened the session: who, in the audit."""
    expires: int
    nonce: str
    secret: bytes

    @property
    def cookie(self) -> str:
        payload = f"{self.admin}.{self.expires}.{self.nonce}"
        return f"{payload}.{_mac(self.secret, payload)}"

    @property
    def csrf(self) -> str:
        """The token every form of this session carries."""
        return _mac(self.secret, "csrf." + self.nonce)

    def csrf_ok(self, token: object) -> bool:
        return isinstance(token, str) and hmac.compare_digest(token.encode(), self.csrf.encode())


def admin_key_of(presented: str, admin_keys: Collection[str]) -> str | None:
    """``presented`` if it is one of ``admin_keys`` (compared in constant time), else None."""
    candidate = presented.encode()
    found = None
    for key in admin_keys:
        if hmac.compare_digest(candidate, key.encode()):
            found = key
    return found


def open_session(key: str, now: float) -> ConsoleSession:
    """A new session for the admin ``key`` (checked by the caller): a fresh nonce every time."""
    return ConsoleSession(
        admin_id(key), int(now) + SESSION_TTL_S, secrets.token_urlsafe(_NONCE_BYTES), _secret(key)
    )


def read_session(cookie: str | None, admin_keys: Collection[str], now: float) -> ConsoleSession | None:
    """The session ``cookie`` carries if an admin key still configured signed it and it has not
    expired; None otherwise."""
    if not cookie or len(cookie) > _COOKIE_MAX:
        return None
    parts = cookie.split(".")
    if len(parts) != 4 or not parts[1].isdigit():
        return None
    admin, expires, nonce, _ = parts
    if int(expires) <= now:
        return None
    for key in admin_keys:
        if hmac.compare_digest(admin_id(key), admin):
            session = ConsoleSession(admin, int(expires), nonce, _secret(key))
            if hmac.compare_digest(session.cookie.encode(), cookie.encode()):
                return session
    return None


def login_token() -> str:
    """The login form's token (also its cookie's value)."""
    return secrets.token_urlsafe(_NONCE_BYTES)


def login_token_ok(cookie: str | None, field: object) -> bool:
    """The login form's token came back in both the cookie and the form, equal."""
    return (
        bool(cookie)
        and isinstance(field, str)
        and len(field) <= _COOKIE_MAX
        and hmac.compare_digest(field.encode(), (cookie or "").encode())
    )
