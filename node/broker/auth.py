"""Users, password hashes, tags and permissions (pure).

Passwords are stored as RabbitMQ's rabbit_password_hashing_sha256 does: base64(salt[4] + sha256(salt + password)).
Permissions are three regular expressions per (user, vhost) — configure, write, read — matched unanchored against
resource names exactly as RabbitMQ's `re:run` does; an empty pattern grants nothing. The default exchange is checked
under the name "amq.default". Users in `loopback_users` may log in only from a loopback peer. In cluster mode the
nodes' internal login (cluster/authlink/amqp_login.py) is recognised before the user table (`is_internal_login`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass, field
from typing import Literal

from node.amqp.auth import parse_sasl_response

Access = Literal["configure", "write", "read"]


def hash_password(password: str, salt: bytes) -> str:
    """RabbitMQ-compatible salted SHA-256 hash (salt must be 4 bytes)."""
    if len(salt) != 4:
        raise ValueError("salt must be 4 bytes")
    digest = hashlib.sha256(salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def check_password(password: str, password_hash: str) -> bool:
    try:
        raw = base64.b64decode(password_hash.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        return False
    if len(raw) != 36:
        return False
    salt = raw[:4]
    expected = hashlib.sha256(salt + password.encode("utf-8")).digest()
    return hmac.compare_digest(expected, raw[4:])


def is_internal_login(login: tuple[str, str], mechanism: str, response: bytes) -> bool | None:
    """Is this PLAIN/AMQPLAIN response the internal login (user, password) `login`? None: another user's name;
    False: its name with a wrong password (refused: the user table is not asked for this name)."""
    parsed = parse_sasl_response(mechanism, response) if mechanism != "EXTERNAL" else None
    if parsed is None or parsed[0] != login[0]:
        return None
    return hmac.compare_digest(parsed[1].encode("utf-8", "surrogateescape"), login[1].encode())


@dataclass(frozen=True, slots=True)
class Permission:
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"

    def pattern(self, access: Access) -> str:
        if access == "configure":
            return self.configure
        if access == "write":
            return self.write
        return self.read


@dataclass(slots=True)
class User:
    name: str
    password_hash: str
    tags: tuple[str, ...] = ()


@dataclass(slots=True)
class UserStore:
    """All users and their per-vhost permissions; compiled regexes are cached."""

    users: dict[str, User] = field(default_factory=dict)
    permissions: dict[tuple[str, str], Permission] = field(default_factory=dict)
    limits: dict[str, dict[str, int]] = field(default_factory=dict)  # user -> max-connections, max-channels
    loopback_users: frozenset[str] = frozenset({"guest"})
    _compiled: dict[str, re.Pattern[str] | None] = field(default_factory=dict)

    def add_user(self, name: str, password: str, tags: tuple[str, ...], salt: bytes) -> User:
        user = User(name, hash_password(password, salt), tags)
        self.users[name] = user
        return user

    def put_user(self, user: User, limits: dict[str, int] | None = None) -> None:
        self.users[user.name] = user
        if limits is not None:  # (a stored user record: its user limits, node/broker/user_limits.py)
            self.set_limits(user.name, limits)

    def set_limits(self, name: str, limits: dict[str, int]) -> None:
        if limits:
            self.limits[name] = dict(limits)
        else:
            self.limits.pop(name, None)

    def delete_user(self, name: str) -> None:
        self.users.pop(name, None)
        self.limits.pop(name, None)
        for key in [k for k in self.permissions if k[0] == name]:
            del self.permissions[key]

    def set_permissions(self, user: str, vhost: str, permission: Permission) -> None:
        self.permissions[(user, vhost)] = permission

    def clear_permissions(self, user: str, vhost: str) -> None:
        self.permissions.pop((user, vhost), None)

    def authenticate_plain(self, username: str, password: str, peer_is_loopback: bool) -> User | None:
        user = self.users.get(username)
        if user is None or not check_password(password, user.password_hash):
            return None
        if username in self.loopback_users and not peer_is_loopback:
            return None
        return user

    def vhost_access(self, username: str, vhost: str) -> bool:
        return (username, vhost) in self.permissions

    def allowed(self, username: str, vhost: str, access: Access, name: str) -> bool:
        perm = self.permissions.get((username, vhost))
        if perm is None:
            return False
        compiled = self._regex(perm.pattern(access))
        if compiled is None:
            return False
        return compiled.search(name or "amq.default") is not None

    def _regex(self, pattern: str) -> re.Pattern[str] | None:
        if pattern in self._compiled:
            return self._compiled[pattern]
        compiled: re.Pattern[str] | None
        if pattern == "":
            compiled = None
        else:
            try:
                compiled = re.compile(pattern)
            except re.error:
                compiled = None
        if len(self._compiled) > 4096:
            self._compiled.clear()
        self._compiled[pattern] = compiled
        return compiled
