"""Bearer tokens for ``sbxkit mcp --http`` (pure).

Every HTTP request carries ``Authorization: Bearer TOKEN``; the token names the client it
belongs to, and that name — never anything else the request says — is whose quota a call
counts against. A token file holds one token per line, ``TOKEN`` or ``NAME TOKEN`` (names are
needed once there are several, one per client); blank lines and ``#`` comments are skipped::

    # sbxkit mcp --http --token-file FILE
    desktop  2vY0h3x2Kc1f8lq3m3sX4fLr6yJk9v0A0tQm7dZg5bE
    ci       Pq8mN1b5oV6r2c9W3xZ7yT4uH0kJ6gF5dS8aL1qE2wR

Only digests of the tokens are kept, and a presented token is compared with every one of them
in constant time (``hmac.compare_digest`` on SHA-256 digests), so neither a token's content nor
which client it matched leaks through timing. No message here ever contains a token.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import stat
from dataclasses import dataclass

from sbxkit.errors import SpecError

MIN_TOKEN_CHARS = 32
"""A token an operator writes must carry at least ~190 bits (32 base64 characters)."""
GENERATED_TOKEN_BYTES = 32
"""A generated token: 256 random bits, URL-safe base64 (43 characters)."""
DEFAULT_NAME = "token"
"""The client name of a file's single unnamed token, and of a generated token."""
MAX_TOKENS = 256
TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
"""RFC 6750's b64token: what fits in ``Authorization: Bearer …`` as it is."""
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SCHEME = b"bearer"


@dataclass(frozen=True)
class Credential:
    """One client's token, kept as its digest only."""

    name: str
    digest: bytes


def digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def new_token() -> str:
    return secrets.token_urlsafe(GENERATED_TOKEN_BYTES)


def generated(token: str) -> tuple[Credential, ...]:
    return (Credential(DEFAULT_NAME, digest(token.encode("ascii"))),)


def parse_tokens(text: str, where: str) -> tuple[Credential, ...]:
    """The credentials of a token file's ``text``; ``where`` names it in every refusal (by
    line, never quoting a token)."""
    entries: list[tuple[int, str | None, str]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) > 2:
            raise SpecError(where, f"line {number}: expected TOKEN or NAME TOKEN")
        name, token = (None, fields[0]) if len(fields) == 1 else (fields[0], fields[1])
        if name is not None and not NAME.fullmatch(name):
            raise SpecError(
                where,
                f"line {number}: a client name is 1-64 letters, digits, '.', '_' or '-' "
                f"(got {name!r})",
            )
        _check_token(token, where, number)
        entries.append((number, name, token))
    if not entries:
        raise SpecError(where, "holds no token")
    if len(entries) > MAX_TOKENS:
        raise SpecError(where, f"holds {len(entries)} tokens; at most {MAX_TOKENS}")
    if len(entries) > 1 and any(name is None for _, name, _ in entries):
        unnamed = next(number for number, name, _ in entries if name is None)
        raise SpecError(
            where, f"line {unnamed}: name each token (NAME TOKEN) when the file holds several"
        )
    credentials: list[Credential] = []
    seen_names: dict[str, int] = {}
    seen_tokens: dict[bytes, int] = {}
    for number, name, token in entries:
        label = name or DEFAULT_NAME
        if label in seen_names:
            raise SpecError(
                where, f"line {number}: the name {label!r} is on line {seen_names[label]} too"
            )
        hashed = digest(token.encode("ascii"))
        if hashed in seen_tokens:
            raise SpecError(
                where, f"line {number}: repeats the token of line {seen_tokens[hashed]}"
            )
        seen_names[label] = number
        seen_tokens[hashed] = number
        credentials.append(Credential(label, hashed))
    return tuple(credentials)


def _check_token(token: str, where: str, number: int) -> None:
    if not TOKEN.fullmatch(token):
        raise SpecError(
            where,
            f"line {number}: a token holds only letters, digits and - . _ ~ + / (then '=' "
            "padding), as in an Authorization header",
        )
    if len(token) < MIN_TOKEN_CHARS:
        raise SpecError(
            where,
            f"line {number}: the token is {len(token)} characters; at least {MIN_TOKEN_CHARS} "
            "(e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))')",
        )


def file_problem(mode: int, owner: int, euid: int) -> str | None:
    """Why a token file's ``stat`` makes it unfit to hold secrets, or None. Only its owner —
    the account the server runs as — may read or write it."""
    if not stat.S_ISREG(mode):
        return "is not a regular file"
    if owner != euid:
        return f"is owned by uid {owner}, not by the account the server runs as (uid {euid})"
    if mode & 0o077:
        return (
            f"is open to group or others (mode {stat.S_IMODE(mode):04o}): anyone who reads it "
            "can use the server; chmod 600 it"
        )
    return None


class Credentials:
    """The tokens a server accepts; ``verify`` says whose a header's is, or why none."""

    def __init__(self, credentials: tuple[Credential, ...]) -> None:
        if not credentials:
            raise ValueError("a server needs at least one token")
        self._credentials = credentials

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(credential.name for credential in self._credentials)

    def verify(self, authorization: bytes | None) -> tuple[str | None, str]:
        """``(client name, "")`` for a header carrying a known bearer token, else ``(None,
        why)``. Every credential is compared, matched or not, in constant time."""
        if authorization is None:
            return None, "no Authorization header"
        scheme, _, token = authorization.strip().partition(b" ")
        if scheme.lower() != SCHEME:
            return None, "the Authorization header is not a bearer token"
        presented = digest(token.strip())
        found: str | None = None
        for credential in self._credentials:
            if hmac.compare_digest(presented, credential.digest) and found is None:
                found = credential.name
        return (found, "") if found is not None else (None, "a wrong bearer token")
