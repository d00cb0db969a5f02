"""The host files a profile names, looked at before anything is served (``sbxkit mcp`` at
start, a local ``sbxkit batch`` before its first job): a file that is not there would fail
every call instead of the start. Each run still checks its own bind sources
(``sbxkit._plan.preflight``)."""

from __future__ import annotations

import contextlib
import os
import stat

from sbxkit._grammar.profile import ROOT, Profile
from sbxkit._model.mounts import BindMount
from sbxkit._model.network_terms import MAX_TLS_FILE_BYTES, Network
from sbxkit._plan.preflight import resolve_host_path
from sbxkit._util.bounded_read import read_bounded
from sbxkit.errors import SpecError


def check_host_files(profile: Profile) -> None:
    """Refuse, by its key and path, a host file the profile names that cannot serve: a bind
    source that does not exist (or is a special file, or resolves into a protected path), an
    audit log whose directory does not exist or that is not a regular file, a TLS file that
    cannot be read or is not PEM, a supervisor binary that is not an executable file. Each run
    checks its bind sources again itself."""
    docker = profile.sandbox.docker
    for index, mount in enumerate(docker.mounts):
        if isinstance(mount, BindMount):
            where = f"{ROOT}.mounts[{index}].source"
            resolve_host_path(where, mount.source, state_dir=docker.supervisor.state_dir)
    log = docker.network_audit_log
    if log is not None:
        where = f"{ROOT}.network_audit_log"
        directory = os.path.dirname(log) or "/"
        if not os.path.isdir(directory):
            raise SpecError(where, f"{log}: its directory {directory} does not exist")
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISREG(os.lstat(log).st_mode):
                raise SpecError(where, f"{log} exists and is not a regular file")
    tls = docker.network.tls if isinstance(docker.network, Network) else None
    for name in ("ca", "cert", "key"):
        path = getattr(tls, name, None)
        if path is not None:
            where = f"{ROOT}.network.tls.{name}"
            if b"-----BEGIN " not in read_bounded(path, field=where, limit=MAX_TLS_FILE_BYTES):
                raise SpecError(where, f"{path} is not PEM (no '-----BEGIN ' line)")
    binary = docker.supervisor.binary
    if binary is not None and not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        raise SpecError(f"{ROOT}.supervisor.binary", f"{binary} is not an executable file")
