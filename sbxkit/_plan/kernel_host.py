"""What this process and its daemon allow: probed once, judged by ``support.py``.

``host_facts`` asks this kernel once per process (a child's exit information through a pidfd;
whether this process may chown). ``daemon_reason`` reads the daemon's ``/info`` once per engine
(the engine caches it) and says why that daemon's containers take the daemon's path, or None.
"""

from __future__ import annotations

import functools
import os
import subprocess
import time

import msgspec

from sbxkit._kernel.pidfd import ExitInfoUnsupported, exit_status, open_pidfd
from sbxkit._kernel.support import HostFacts, daemon_path_reason, run_path_reason
from sbxkit._plan.plan import CheckedSpec, DaemonFacts
from sbxkit.engine.client import Engine
from sbxkit.errors import SbxError

__all__ = ["daemon_reason", "host_facts", "kernel_path_reason", "shellless_images"]

shellless_images: set[str] = set()
"""Image ids whose containers never ran the FIFO shell (no ``/bin/sh``): their runs take the
daemon's path from then on, in this process."""


def _exit_info_supported() -> bool:
    try:
        child = subprocess.Popen(["/bin/true"], close_fds=True)
    except OSError:
        return False
    try:
        pidfd = open_pidfd(child.pid)
    except OSError:
        child.wait()
        return False
    try:
        child.wait()
        return exit_status(pidfd) == 0
    except (ExitInfoUnsupported, OSError):
        return False
    finally:
        os.close(pidfd)


def _can_chown() -> bool:
    if os.geteuid() == 0:
        return True
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & 1)  # CAP_CHOWN is bit 0
    except (OSError, ValueError):
        pass
    return False


@functools.cache
def host_facts() -> HostFacts:
    return HostFacts(
        exit_info=_exit_info_supported(),
        can_chown=_can_chown(),
        kernel_release=os.uname().release,
    )


DAEMON_FACTS_MAX_AGE_S = 60.0
"""How long a daemon's verdict is kept (per socket, in this process): ``/info`` is slow, and
a one-shot run opens a fresh engine each time."""


class _DaemonVerdict(msgspec.Struct, frozen=True):
    at: float
    reason: str | None
    default_runtime: str


_VERDICTS: dict[str, _DaemonVerdict] = {}


async def _verdict(engine: Engine) -> _DaemonVerdict:
    now = time.monotonic()
    cached = _VERDICTS.get(engine.socket_path)
    if cached is not None and now - cached.at < DAEMON_FACTS_MAX_AGE_S:
        return cached
    host = host_facts()
    if not host.exit_info:  # no need to ask the daemon
        reason = daemon_path_reason(
            host, podman=False, daemon_kernel="", operating_system="", security_options=()
        )
        verdict = _DaemonVerdict(now, reason, "")
    else:
        try:
            info = await engine.cached_info()
        except SbxError as exc:
            return _DaemonVerdict(now, f"the daemon's /info did not answer ({exc})", "")
        reason = daemon_path_reason(
            host,
            podman=engine.is_podman,
            daemon_kernel=info.kernel_version,
            operating_system=info.operating_system,
            security_options=info.security_options or (),
        )
        verdict = _DaemonVerdict(now, reason, info.default_runtime or "runc")
    _VERDICTS[engine.socket_path] = verdict
    return verdict


async def daemon_reason(engine: Engine) -> str | None:
    """Why this daemon's containers cannot take the kernel path, or None if they can."""
    return (await _verdict(engine)).reason


async def kernel_path_reason(
    engine: Engine, checked: CheckedSpec, facts: DaemonFacts
) -> str | None:
    """Why this run takes the daemon's path, or None: it takes the kernel's."""
    if checked.settings.evidence == "daemon":
        return "evidence = daemon (the settings, or SBXKIT_EVIDENCE)"
    if facts.root_witness is not None:  # its uids are not the host's where it may run at all
        return "a workspace with root inside (its uids are mapped, or its kernel is gVisor's)"
    verdict = await _verdict(engine)
    if verdict.reason is not None:
        return verdict.reason
    return run_path_reason(
        runtime=facts.daemon.runtime or verdict.default_runtime,
        command=checked.spec.command,
        has_shell=False if facts.image_id in shellless_images else None,
        env_keys=[*facts.image_env, *checked.spec.env],
    )
