"""Which OCI runtime a sandbox runs under, and what each runtime cannot honour.

Pure: names and numbers in, a daemon's runtime name or ``SpecError`` out. The I/O shell
(``sbxkit._plan.preflight.check_daemon``) reads the daemon's ``/info`` and hands its default and
registered runtimes to ``plan_runtime``, the one place a sandbox's runtime is decided.
"""

from __future__ import annotations

from collections.abc import Iterable

from sbxkit._model.network_terms import Network, network_mode
from sbxkit.errors import SpecError

RUNTIME_ALIASES = {"gvisor": "runsc"}
"""Friendly names for OCI runtimes whose daemon name differs."""


def runtime_name(runtime: str | None) -> str | None:
    """The daemon's name for a requested runtime; None names none (``plan_runtime`` decides)."""
    if runtime is None:
        return None
    return RUNTIME_ALIASES.get(runtime, runtime)


def check_runtime_registered(runtime: str | None, registered: Iterable[str]) -> str | None:
    """Refuse a runtime the daemon's ``/info`` does not list; return the daemon's name for it."""
    name = runtime_name(runtime)
    if name is None:
        return None
    known = sorted(set(registered))
    if name in known:
        return name
    asked = f"{runtime!r} (daemon name {name!r})" if name != runtime else repr(name)
    listing = ", ".join(known) if known else "(none)"
    raise SpecError("runtime", f"{asked} is not registered in the daemon; registered: {listing}")


GVISOR_RUNTIME = "runsc"
GVISOR_MIN_PIDS = 256
"""gVisor's own Sentry and gofer threads (about 45 on an idle sandbox, more per payload task and
more again while the host's CPUs are contended: the Go runtime adds threads for blocked
syscalls) live in the container's pids cgroup. Over the ceiling the whole sandbox dies (exit 2,
no message): with 16 it cannot start, with 64 a shell with five background children kills it,
and with 128 an idle-looking session died under CPU load; 256 held in the same load."""


RUNC_RUNTIME = "runc"
CRUN_RUNTIME = "crun"
CRUN_MIN_FSIZE = 32 * 1024
"""crun sets the container's rlimits on itself before it has finished its own setup, and part
of that setup is a file it writes and reads back: the compiled seccomp filter (Docker 20.10's
default profile is 955 BPF instructions, 7640 bytes, on this x86-64 host: fsize 7639 fails
with ``SECCOMP_SET_MODE_FILTER: Invalid argument``, 7640 starts). No classic BPF filter can be
longer than the kernel's 4096 instructions of 8 bytes, so 32 KiB holds any profile a daemon
may grow to; below it the default runtime falls back to runc, which sets them last."""


def check_crun_fsize(runtime: str | None, fsize_bytes: int | None) -> None:
    """Refuse crun with an fsize ceiling it cannot start under (``CRUN_MIN_FSIZE``)."""
    if runtime_name(runtime) != CRUN_RUNTIME or fsize_bytes is None:
        return
    if fsize_bytes < CRUN_MIN_FSIZE:
        raise SpecError(
            "limits.fsize_bytes",
            f"{fsize_bytes} is under crun's floor of {CRUN_MIN_FSIZE} bytes: crun applies the "
            "container's file size ceiling to itself before it writes its seccomp filter, so "
            "the sandbox cannot start; use runtime='runc' or a larger fsize",
        )


def plan_runtime(
    runtime: str | None,
    *,
    podman: bool,
    default_runtime: str,
    registered: Iterable[str],
    fsize_bytes: int,
    gpus: bool = False,
    remapped: bool = False,
) -> str | None:
    """The daemon's name of the runtime a sandbox runs under; None keeps the daemon's default.

    A runtime the spec names must be registered (and crun must fit, ``check_crun_fsize``).
    One it does not name is crun where that is cheaper and changes no guarantee: a Docker
    daemon (Podman's compat API ignores ``HostConfig.Runtime``) whose default is runc (an
    operator's other default, say runsc, is kept: isolation is never weakened silently) and
    which registers crun; no GPUs (crun under the NVIDIA hook is untested here); a daemon that
    maps container uids to subordinate ids (``remapped``: userns-remap or rootless) keeps its
    default, as crun failed execs right after a start on a userns-remap daemon under load; an
    fsize at or over ``CRUN_MIN_FSIZE``, else runc, named so the post-create check verifies it.
    """
    known = set(registered)
    if runtime is not None:
        name = check_runtime_registered(runtime, known)
        check_crun_fsize(name, fsize_bytes)
        return name
    if podman or gpus or remapped or default_runtime != RUNC_RUNTIME or CRUN_RUNTIME not in known:
        return None
    if fsize_bytes < CRUN_MIN_FSIZE:
        return RUNC_RUNTIME
    return CRUN_RUNTIME


def check_runtime_fit(
    runtime: str | None, network: object, pids: int | None, fsize_bytes: int | None = None
) -> None:
    """Refuse what a runtime cannot honour as asked, by name, before any container exists.

    runsc is registered with ``--network=none`` (without it a ``none`` container cannot start
    under Docker 20.10), so a routed container under it would silently get no network, and a
    governed network's listeners — bound in the sandbox's namespace on the host — are not on
    the loopback of gVisor's own network stack; and its pids ceiling counts gVisor's own
    threads, so a small ceiling means a sandbox that dies. crun cannot start under a small
    fsize ceiling (``CRUN_MIN_FSIZE``).
    """
    check_crun_fsize(runtime, fsize_bytes)
    if runtime_name(runtime) != GVISOR_RUNTIME:
        return
    mode = network_mode(network)
    if mode in ("bridge", "managed"):
        raise SpecError(
            "network",
            f"{mode} is refused under gVisor (runsc): the runtime is registered with "
            f"--network=none, so the sandbox would get no network; use runc or crun for {mode}",
        )
    if isinstance(network, Network) and (
        network.allow or network.callback is not None or network.ports
    ):
        raise SpecError(
            "network",
            "a governed network is refused under gVisor (runsc): its listeners are bound in the "
            "sandbox's namespace on the host, which gVisor's own network stack does not use; "
            "use runc or crun",
        )
    if pids is not None and pids < GVISOR_MIN_PIDS:
        raise SpecError(
            "limits.pids",
            f"must be at least {GVISOR_MIN_PIDS} under gVisor (runsc): its pids ceiling also "
            "counts the sandbox kernel's own threads, and below that the sandbox dies on its "
            "first few children or under CPU load",
        )


def check_podman_runtime(runtime: str | None, default_runtime: str) -> None:
    """Refuse a runtime a Podman service would not use, before any container exists.

    Podman 4.3's Docker-compatible create ignores ``HostConfig.Runtime``: asking for gVisor
    would silently run the service's default (crun), and its inspect says ``oci`` either way.
    """
    name = runtime_name(runtime)
    if name is None or name == default_runtime:
        return
    raise SpecError(
        "runtime",
        f"{name!r} cannot be selected through Podman's Docker-compatible API, which ignores "
        f"HostConfig.Runtime and would run {default_runtime or 'its default runtime'!r}; "
        "configure the Podman service's default runtime, or use Docker for this runtime",
    )
