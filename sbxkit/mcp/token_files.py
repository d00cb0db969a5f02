"""Where ``sbxkit mcp --http`` gets its bearer tokens: the operator's file, or one it makes.

``--token-file FILE`` is read once at start and refused by name when it is missing, unfit
(``sbxkit.mcp.tokens.file_problem``: not the server account's, or open to group or others) or
holds a token too short. Without it the server generates a token and writes it to
``~/.sbxkit/mcp/HOST-PORT.token`` (the directory 0700, the file 0600, replaced atomically),
prints that path — never the token — and removes the file when it stops.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from sbxkit.errors import SpecError
from sbxkit.mcp.tokens import Credentials, file_problem, generated, new_token, parse_tokens

OPTION = "--token-file"
MAX_FILE_BYTES = 64 * 1024


def read_token_file(path: str) -> Credentials:
    """The operator's tokens (``sbxkit.mcp.tokens`` describes the file)."""
    where = f"{OPTION} {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SpecError(where, "no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SpecError(where, "is a symbolic link; name the file itself") from None
        raise SpecError(where, f"cannot be opened: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        problem = file_problem(info.st_mode, info.st_uid, os.geteuid())
        if problem is not None:
            raise SpecError(where, problem)
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise SpecError(where, f"is larger than {MAX_FILE_BYTES} bytes: not a token file")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise SpecError(where, "is not ASCII text: not a token file") from None
    return Credentials(parse_tokens(text, where))


def generated_token_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".sbxkit", "mcp")


def generated_token_path(host: str, port: int) -> str:
    return os.path.join(generated_token_dir(), f"{host}-{port}.token")


def write_generated_token(host: str, port: int) -> tuple[str, Credentials]:
    """A fresh token, written where only this account can read it; ``(its path, the
    credentials)``. A file left by an earlier server on the same address is replaced."""
    directory = generated_token_dir()
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        info = os.stat(directory, follow_symlinks=False)
    except OSError as exc:
        raise SpecError(directory, f"cannot hold the bearer token: {exc.strerror}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise SpecError(directory, "is not a directory of the account the server runs as")
    if info.st_mode & 0o077:
        raise SpecError(
            directory,
            f"is open to group or others (mode {stat.S_IMODE(info.st_mode):04o}); chmod 700 it",
        )
    path = generated_token_path(host, port)
    token = new_token()
    staging = f"{path}.{os.getpid()}.new"
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(token + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(staging, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staging)
        raise
    return path, Credentials(generated(token))


def remove_token_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
