"""Throwaway local accounts for attacker tests: a hostile neighbour is a real second account.

A security test that plays another local user creates one here (``useradd``), runs the
attacker's commands as it (``setpriv``: its uid, its gid, no supplementary groups, a clean
environment), and removes it afterwards with every process it left. Needs root, as the whole
engine suite does; a missing tool fails the test, it never skips.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

NOLOGIN = "/usr/sbin/nologin"


@dataclass(frozen=True)
class Account:
    """A local account made for one test: never root, in no group but its own."""

    name: str
    uid: int
    gid: int
    home: str

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run as this account: its uid and gid, no other group, no capability."""
        return [
            shutil.which("setpriv") or "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
            *argv,
        ]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A login-like environment of its own: nothing of the test's (no state dir, no
        DOCKER_HOST, no token)."""
        base = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self.home,
            "USER": self.name,
            "LANG": "C.UTF-8",
        }
        return {**base, **(extra or {})}

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        kwargs.setdefault("cwd", self.home)
        kwargs.setdefault("timeout", 120)
        return subprocess.run(self.argv(argv), env=self.env(env), check=False, **kwargs)

    def popen(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs: Any
    ) -> subprocess.Popen[Any]:
        kwargs.setdefault("cwd", self.home)
        return subprocess.Popen(self.argv(argv), env=self.env(env), **kwargs)

    def python(self, code: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Plain standard-library Python as this account (no sbxkit, no site of ours)."""
        return self.run(["python3", "-I", "-c", code, *args], **kwargs)


def _processes_of(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid == uid:
                pids.append(int(entry))
        except OSError:
            continue
    return pids


@contextmanager
def local_account(prefix: str = "sbxatk") -> Iterator[Account]:
    """A fresh non-root account with a private home (0700), removed on the way out with
    every process it still runs (SIGKILL), so nothing of the attacker outlives the test."""
    if os.geteuid() != 0:
        raise RuntimeError("creating an attacker account needs root (the engine suite's user)")
    if shutil.which("useradd") is None or shutil.which("setpriv") is None:
        raise RuntimeError("useradd and setpriv are needed (Debian: passwd, util-linux)")
    name = f"{prefix}{secrets.token_hex(3)}"
    home = f"/home/{name}"
    subprocess.run(
        ["useradd", "--create-home", "--home-dir", home, "--shell", NOLOGIN, "--user-group", name],
        check=True,
        capture_output=True,
    )
    entry = pwd.getpwnam(name)
    os.chmod(home, 0o700)
    try:
        if entry.pw_uid == 0 or entry.pw_gid == 0:
            raise RuntimeError(f"useradd gave {name} uid {entry.pw_uid}, gid {entry.pw_gid}")
        yield Account(name, entry.pw_uid, entry.pw_gid, home)
    finally:
        for _ in range(50):
            pids = _processes_of(entry.pw_uid)
            if not pids:
                break
            for pid in pids:
                with suppress(ProcessLookupError):
                    os.kill(pid, 9)
            time.sleep(0.1)
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


__all__ = ["Account", "local_account"]
