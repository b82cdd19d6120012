# Owns who may write through the console and read message bodies: the
# accounts (the plain ACL's `admin: true` accounts, or a --users file of
# scrypt hashes), password checks, the server-side sessions behind the
# console's cookie, and the bound on failed logins per client.  Pure apart
# from the hashing: the clock is handed in (tests advance a fake one), the
# HTTP side (cookie, 401/429) is app.py's.
#
# --users file, one account per line ("#" starts a comment):
#
#   NAME:scrypt$N$R$P$SALT_HEX$HASH_HEX
#
# written by `mqdashboard --hash-password NAME` (asks for the password).
# Rules kept: no password is stored or kept in memory in clear (ACL secrets
# are hashed when the file is read); a session token is 32 random bytes,
# compared in constant time through the dict lookup of its SHA-256; a
# session ends after `idle_s` without a request or `absolute_s` after the
# login, whichever comes first, and on logout; at most MAX_SESSIONS live
# (the oldest goes); a client (IP) with `max_failures` failed logins within
# `failure_window_s` is refused until the window passes, and the table of
# clients is bounded (MAX_CLIENTS, oldest forgotten first).
import hashlib
import hmac
import secrets
import time
from collections import OrderedDict

import attrs

SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 14, 8, 1
MAX_SESSIONS = 1024
MAX_CLIENTS = 4096
MAX_NAME = 128
MAX_PASSWORD = 1024
MAX_USERS_FILE = 1 << 20


class UsersFileError(ValueError):
    """The --users file or ACL file cannot be used (the line and why)."""


@attrs.frozen(repr=False)
class PasswordHash:
    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    def __repr__(self) -> str:
        return "PasswordHash(scrypt)"

    def text(self) -> str:
        return f"scrypt${self.n}${self.r}${self.p}${self.salt.hex()}${self.digest.hex()}"

    def matches(self, password: str) -> bool:
        got = hashlib.scrypt(password.encode("utf-8"), salt=self.salt, n=self.n, r=self.r, p=self.p,
                             maxmem=256 << 20, dklen=len(self.digest))
        return hmac.compare_digest(got, self.digest)


def hash_password(password: str, salt: bytes | None = None) -> PasswordHash:
    salt = secrets.token_bytes(16) if salt is None else salt
    digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    return PasswordHash(SCRYPT_N, SCRYPT_R, SCRYPT_P, salt, digest)


def parse_hash(text: str, where: str) -> PasswordHash:
    parts = text.strip().split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise UsersFileError(f"{where}: not NAME:scrypt$N$R$P$SALT$HASH (write it with mqdashboard --hash-password)")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, digest = bytes.fromhex(parts[4]), bytes.fromhex(parts[5])
    except ValueError:
        raise UsersFileError(f"{where}: N, R, P must be numbers and SALT, HASH hex") from None
    # Bounds: a hostile file must not make every login cost gigabytes.
    if not (2 <= n <= 1 << 20 and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16
            and 8 <= len(salt) <= 64 and 16 <= len(digest) <= 64):
        raise UsersFileError(f"{where}: scrypt parameters out of range (N a power of two <= 2^20, R <= 32, "
                             f"P <= 16, salt 8-64 bytes, hash 16-64 bytes)")
    return PasswordHash(n, r, p, salt, digest)


def parse_users_text(text: str, source: str) -> dict[str, PasswordHash]:
    users: dict[str, PasswordHash] = {}
    for no, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{no}"
        name, sep, rest = line.partition(":")
        name = name.strip()
        if not sep or not name or len(name) > MAX_NAME:
            raise UsersFileError(f"{where}: expected NAME:scrypt$... (a name of 1-{MAX_NAME} characters)")
        if name in users:
            raise UsersFileError(f"{where}: user {name!r} is listed twice")
        users[name] = parse_hash(rest, where)
    return users


def load_users_file(path: str) -> dict[str, PasswordHash]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_USERS_FILE + 1)
    except (OSError, UnicodeDecodeError) as e:
        raise UsersFileError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    if len(text) > MAX_USERS_FILE:
        raise UsersFileError(f"{path}: larger than {MAX_USERS_FILE} bytes")
    users = parse_users_text(text, path)
    if not users:
        raise UsersFileError(f"{path}: no user in it")
    return users


def acl_admin_users(path: str) -> dict[str, PasswordHash]:
    """The `admin: true` accounts of a plain_acl.yml: access key -> hash of
    its secret key (the clear secret is not kept)."""
    from broker.acl.plain import AclConfigError, load_plain_acl
    try:
        rules = load_plain_acl(path)
    except AclConfigError as e:
        raise UsersFileError(str(e)) from None
    users = {a.access_key: hash_password(a.secret_key) for a in rules.accounts.values() if a.admin}
    if not users:
        raise UsersFileError(f"{path}: no account with admin: true (only admin accounts may log in)")
    return users


@attrs.define
class Session:
    user: str
    created: float
    last_seen: float


@attrs.define
class Auth:
    """Accounts, sessions and the failed-login bound.  `users` empty: no
    login is configured (the console is open as before; see app.py)."""

    users: dict[str, PasswordHash] = attrs.Factory(dict)
    idle_s: float = 30 * 60
    absolute_s: float = 8 * 3600
    max_failures: int = 5
    failure_window_s: float = 300.0
    clock: object = time.monotonic
    _sessions: OrderedDict = attrs.Factory(OrderedDict)  # sha256(token) -> Session
    _failures: OrderedDict = attrs.Factory(OrderedDict)  # client -> [window start, count]

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    # --- failed logins -------------------------------------------------------------

    def retry_after(self, client: str) -> float | None:
        """Seconds until `client` may try again, None if it may now."""
        entry = self._failures.get(client)
        if entry is None:
            return None
        left = entry[0] + self.failure_window_s - self.clock()
        if left <= 0:
            del self._failures[client]
            return None
        return left if entry[1] >= self.max_failures else None

    def _failed(self, client: str) -> None:
        now = self.clock()
        entry = self._failures.get(client)
        if entry is None or entry[0] + self.failure_window_s <= now:
            entry = [now, 0]
        entry[1] += 1
        self._failures[client] = entry
        self._failures.move_to_end(client)
        while len(self._failures) > MAX_CLIENTS:
            self._failures.popitem(last=False)

    # --- login / sessions ------------------------------------------------------------

    def check_password(self, user: str, password: str) -> bool:
        """Blocking (scrypt): call it off the event loop."""
        hashed = self.users.get(user)
        if hashed is None or len(password) > MAX_PASSWORD:
            # Spend the same work for an unknown name: no user enumeration by timing.
            hash_password(password[:MAX_PASSWORD], salt=b"\0" * 16)
            return False
        return hashed.matches(password)

    def login_result(self, client: str, user: str, ok: bool) -> str | None:
        """The new session's token after a password check, or None (counted
        as a failure of `client`)."""
        if not ok:
            self._failed(client)
            return None
        self._failures.pop(client, None)
        token = secrets.token_urlsafe(32)
        now = self.clock()
        self._sessions[_digest(token)] = Session(user, now, now)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return token

    def session(self, token: str | None) -> Session | None:
        """The live session of a token (its idle clock restarted), or None."""
        if not token or len(token) > 128:
            return None
        key = _digest(token)
        s = self._sessions.get(key)
        if s is None:
            return None
        now = self.clock()
        if now - s.last_seen > self.idle_s or now - s.created > self.absolute_s:
            del self._sessions[key]
            return None
        s.last_seen = now
        return s

    def logout(self, token: str | None) -> None:
        if token and len(token) <= 128:
            self._sessions.pop(_digest(token), None)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "replace")).digest()
