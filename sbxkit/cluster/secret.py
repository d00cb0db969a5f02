"""The cluster secret: what the driver and every sbxkit node share, and a rogue node lacks.

Ray's token authenticates who may join the Ray cluster at all; the cluster secret binds what
crosses it for sbxkit (``seal.py``): a node's join report, each job (sealed: its stdin and
environment stay unreadable off the driver and the agents), and each outcome. The operator
distributes it to the driver and to the sbxkit nodes only, as one of

- ``SBXKIT_CLUSTER_SECRET_FILE``: an absolute path to a regular file owned by this account (or
  root) that no group or other account may read or write (``chmod 600``); or
- ``SBXKIT_CLUSTER_SECRET``: the secret itself.

Either holds at least ``MIN_SECRET_BYTES`` bytes (trailing whitespace stripped). Anything else
is refused by the variable's name, with the rule (``secret_problem`` is the pure verdict).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from sbxkit.errors import SpecError

SECRET_FILE_ENV = "SBXKIT_CLUSTER_SECRET_FILE"
SECRET_ENV = "SBXKIT_CLUSTER_SECRET"
MIN_SECRET_BYTES = 32
MAX_SECRET_BYTES = 4096
HOW = "python3 -c 'import secrets; print(secrets.token_hex(32))'"
"""How to make one (64 hex characters), named in every refusal."""


def length_problem(secret: bytes) -> str | None:
    """Why ``secret`` (already stripped) is no cluster secret, or None."""
    if len(secret) < MIN_SECRET_BYTES:
        return (
            f"is too short ({len(secret)} bytes; at least {MIN_SECRET_BYTES}): make one with {HOW}"
        )
    if len(secret) > MAX_SECRET_BYTES:
        return f"is too long ({len(secret)} bytes; at most {MAX_SECRET_BYTES})"
    return None


def file_problem(mode: int, owner: int, me: int) -> str | None:
    """Why a secret file with ``mode`` and ``owner`` (its ``stat``, symlinks followed) may not
    be trusted by account ``me``, or None."""
    if not stat.S_ISREG(mode):
        return "is not a regular file"
    if owner not in (me, 0):
        return f"is owned by uid {owner}, neither this account ({me}) nor root"
    if mode & 0o077:
        return (
            f"is readable or writable by others (mode {stat.S_IMODE(mode):04o}): "
            "chmod 600 it (Kubernetes: defaultMode 0400)"
        )
    return None


def load_secret(environ: Mapping[str, str] | None = None) -> bytes:
    """This process's cluster secret, from its environment. Raises ``SpecError`` naming the
    variable and the rule."""
    environ = os.environ if environ is None else environ
    path = environ.get(SECRET_FILE_ENV, "")
    inline = environ.get(SECRET_ENV, "")
    if path and inline:
        raise SpecError(SECRET_FILE_ENV, f"and {SECRET_ENV} are both set: set one")
    if inline:
        secret = inline.encode("utf-8", "surrogateescape").strip()
        problem = length_problem(secret)
        if problem is not None:
            raise SpecError(SECRET_ENV, problem)
        return secret
    if not path:
        raise SpecError(
            SECRET_FILE_ENV,
            f"is not set (nor {SECRET_ENV}): every sbxkit node and the driver need the "
            f"cluster's secret, in a file only its owner can read ({HOW} > FILE; chmod 600 "
            "FILE); docs/cluster.md",
        )
    if not os.path.isabs(path):
        raise SpecError(SECRET_FILE_ENV, f"must be an absolute path, got {path!r}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise SpecError(SECRET_FILE_ENV, f"{path}: cannot be opened ({exc.strerror})") from None
    try:
        facts = os.fstat(fd)  # the file read, not a name that may change under us
        problem = file_problem(facts.st_mode, facts.st_uid, os.geteuid())
        if problem is not None:
            raise SpecError(SECRET_FILE_ENV, f"{path} {problem}")
        secret = os.read(fd, MAX_SECRET_BYTES + 1).strip()
    finally:
        os.close(fd)
    problem = length_problem(secret)
    if problem is not None:
        raise SpecError(SECRET_FILE_ENV, f"{path} {problem}")
    return secret
