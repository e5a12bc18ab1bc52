"""Who a context belongs to: the client (by its key's hash), the session and the user.

Session and user ids are opaque strings the application chooses (``X-Cognitive-Session`` or
``_context.session_id``; ``X-Cognitive-User``). Every stored key starts with the namespace of the
client key's hash, so a client naming another client's session id reads nothing of it. The
client key itself is never stored or logged.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, replace
from typing import Any

import orjson

SESSION_HEADER = "X-Cognitive-Session"
USER_HEADER = "X-Cognitive-User"
SESSION_FIELD = "session_id"
"""``_context.session_id``: the session in the body, when the header is not sent."""
MAX_ID_CHARS = 128
"""Ids are names, not data: 128 characters hold a UUID, a ULID or a hash with room to spare, and
keep every key short."""
ID_PATTERN = re.compile(rf"^[A-Za-z0-9._~-]{{1,{MAX_ID_CHARS}}}\Z")
"""No ``:`` or ``*`` (key separators and patterns), no whitespace or control characters (``\\Z``:
``$`` also matches before a final newline)."""
KEY_PREFIX = "cogproxy:ctx"
NAMESPACE_HEX = 32
"""128 bits of the SHA-256 of the client key: enough that two keys never share a namespace."""
ANONYMOUS = "anonymous"
"""The namespace hash input when the proxy has no client keys (every caller is one client)."""


class IdentityError(ValueError):
    """An id that is not an opaque short name; the message names where it came from."""


def check_id(value: object, source: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise IdentityError(
            f"{source} must be 1-{MAX_ID_CHARS} characters of letters, digits, '.', '_', '~' or '-'"
        )
    return value


@functools.lru_cache(maxsize=1024)  # a few identities (the keys file's): hashed once each
def namespace_of(client_key: str | None) -> str:
    digest = hashlib.sha256((client_key or ANONYMOUS).encode()).hexdigest()
    return digest[:NAMESPACE_HEX]


def namespace_in(key: str) -> str:
    """The client namespace of a key ``Identity.key`` built ("" for any other key)."""
    prefix, _, rest = key.partition(":ctx:")
    return rest.partition(":")[0].strip("{}") if prefix + ":ctx" == KEY_PREFIX else ""


@dataclass(frozen=True, slots=True)
class Identity:
    namespace: str
    session_id: str | None = None
    user_id: str | None = None

    def key(self, *parts: str) -> str:
        """``cogproxy:ctx:{<namespace>}:<parts>``: the namespace is the key's hash tag, so a client's
        keys and its quota's share one Redis Cluster slot (the quota script touches them together)."""
        return ":".join((KEY_PREFIX, f"{{{self.namespace}}}", *parts))


CONTEXT_FIELD = "_context"


def without_context(value: Any) -> Any:
    """The module input as its schema and the cache see it: ``_context`` left out."""
    if isinstance(value, dict) and CONTEXT_FIELD in value:
        return {k: v for k, v in value.items() if k != CONTEXT_FIELD}
    return value


def call_identity(identity: Identity, client: dict[str, Any]) -> Identity:
    """The caller's identity for a call whose ``_context`` is ``client``: the body's session id
    when no header named one. Raises ``IdentityError`` for a session id that is no opaque name."""
    body_session = check_id(client.get(SESSION_FIELD), "_context.session_id")
    if identity.session_id is None and body_session is not None:
        return replace(identity, session_id=body_session)
    return identity


CLIENT_DIGEST_HEX = 16


def client_digest(client: dict[str, Any]) -> str:
    """A digest of the ``_context`` the caller sent, its session id left out ("" for none): it is
    known before any context is read, so a result-cache key can hold it (``proxy.context.cache``)."""
    sent = {k: v for k, v in client.items() if k != SESSION_FIELD}
    if not sent:
        return ""
    return hashlib.sha256(orjson.dumps(sent, option=orjson.OPT_SORT_KEYS)).hexdigest()[:CLIENT_DIGEST_HEX]


def input_hash(value: object) -> str:
    """Spec §5.3 ``${input_hash}``: SHA-256 of the canonical input (sorted keys), ``_context``
    left out."""
    value = without_context(value)
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


def expand(pattern: str, identity: Identity, module: str, hashed_input: str) -> str | None:
    """A key pattern with its variables filled in; None when it needs a session or user id the
    call does not have."""
    values = {
        "${module}": module,
        "${input_hash}": hashed_input,
        "${session_id}": identity.session_id,
        "${user_id}": identity.user_id,
    }
    out = pattern
    for variable, value in values.items():
        if variable in out:
            if value is None:
                return None
            out = out.replace(variable, value)
    return out
