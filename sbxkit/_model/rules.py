"""Policy rules that judge single values: extra flags, networking, environment, engines.

Pure: strings and mappings in, values or ``SpecError`` out; no trio, no I/O, no ``os.environ``. The
I/O shell (``sbxkit._consumers.runner``) reads ``SBXKIT_ENV`` and the daemon's ``/info`` and hands
the results to these functions, so every rule can be tested exhaustively without a daemon.

Extra flags
    ``extra_flags`` exists for configuration written for ``docker run``. It accepts metadata
    only: ``--label=key=value``. Everything that could change what the sandbox may do —
    privilege, runtime, network, PID/IPC/user/cgroup namespaces, mounts, entrypoint, user,
    environment, capabilities, security options, devices, limits — is refused with the reason
    and the spec field to use instead. Anything else is refused too: an allow-list, not a
    deny-list, so a flag Docker adds tomorrow is refused until someone decides otherwise.

Networking
    ``none`` (the default) or ``bridge``. Host networking and ``container:<id>`` namespaces are
    refused forever. ``bridge`` is unrestricted egress — it is *not* destination authorisation:
    the payload can reach anything the host's bridge can route to, including
    ``host.docker.internal``. Production (``SBXKIT_ENV``) refuses it for every worker kind.

Environment ownership
    The container's environment is layered: profile (template) values, then the spec's, then
    the keys the runtime owns (``SBXKIT_LEASE``, ``SBXKIT_SANDBOX``), which always win. Nothing
    from the host's environment enters unless a caller named it (the CLI's bare ``--env K``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import cast

from sbxkit._model.network_terms import Network, check_network_spec, network_mode
from sbxkit._model.predicates import has_control
from sbxkit._model.settings import EnvKind, parse_environment
from sbxkit._model.textcheck import check_utf8
from sbxkit.errors import SpecError

LEASE_LABEL = "sbxkit.lease"
"""Label naming the lease that owns a container; reserved, set only by sbxkit."""
DISK_LABEL = "sbxkit.disk"
"""Label carrying a writable image filesystem's bound in bytes (``Workspace.disk_bytes``): the
supervisor watches the container against it where no kernel quota holds it."""
RESERVED_LABELS = (LEASE_LABEL, DISK_LABEL)

# --- extra flags -----------------------------------------------------------------------------

ONLY_LABELS = "only --label=key=value is accepted"

_PRIVILEGED = "privileged mode is refused: it undoes every isolation sbxkit sets"
_RUNTIME = "the runtime is selected with runtime"
_NETWORK = (
    "networking is selected with network ('none' or 'bridge'); "
    "host and container namespaces are refused"
)
_PID = "the PID namespace is always private"
_MOUNTS = "mounts are declared in mounts (bind, volume or tmpfs) and checked there"
_ENTRYPOINT = "the entrypoint is always empty; the command runs exactly as given"
_ENV = "environment variables are set in env (a host value enters only when named)"
_USER = "the user is set with user (numeric UID:GID, never root)"
_CAPS = "capabilities are always dropped (CapDrop=ALL); none can be added"
_SECURITY = "security options are fixed (no-new-privileges)"
_DEVICE = "host devices are never passed through; GPUs are requested with gpus (CDI)"
_IPC = "the IPC namespace is always private"
_USERNS = "the user namespace mode is the daemon's and cannot be changed per sandbox"
_CGROUPNS = "the cgroup namespace is always private"
_LIMITS = "limits are set in limits"
_WORKDIR = "the working directory is set with workdir"
_LABEL_SHAPE = "write labels as one argument, --label=key=value"

# Exact long-flag names (the part before '=').
_LONG_REASONS: dict[str, str] = {
    "--privileged": _PRIVILEGED,
    "--runtime": _RUNTIME,
    "--network": _NETWORK,
    "--net": _NETWORK,
    "--network-alias": _NETWORK,
    "--net-alias": _NETWORK,
    "--link": _NETWORK,
    "--add-host": _NETWORK,
    "--ip": _NETWORK,
    "--ip6": _NETWORK,
    "--mac-address": _NETWORK,
    "--publish": _NETWORK,
    "--publish-all": _NETWORK,
    "--expose": _NETWORK,
    "--pid": _PID,
    "--mount": _MOUNTS,
    "--volume": _MOUNTS,
    "--volumes-from": _MOUNTS,
    "--volume-driver": _MOUNTS,
    "--tmpfs": _MOUNTS,
    "--read-only": _MOUNTS,
    "--entrypoint": _ENTRYPOINT,
    "--env": _ENV,
    "--env-file": _ENV,
    "--user": _USER,
    "--group-add": _USER,
    "--cap-add": _CAPS,
    "--cap-drop": _CAPS,
    "--security-opt": _SECURITY,
    "--device": _DEVICE,
    "--device-cgroup-rule": _DEVICE,
    "--gpus": _DEVICE,
    "--ipc": _IPC,
    "--userns": _USERNS,
    "--cgroupns": _CGROUPNS,
    "--cgroup-parent": _CGROUPNS,
    "--pids-limit": _LIMITS,
    "--ulimit": _LIMITS,
    "--shm-size": _LIMITS,
    "--storage-opt": _LIMITS,
    "--kernel-memory": _LIMITS,
    "--oom-kill-disable": _LIMITS,
    "--oom-score-adj": _LIMITS,
    "--workdir": _WORKDIR,
    "--label-file": _LABEL_SHAPE,
}
# Long-flag families, by prefix (checked after the exact names, longest prefix first).
_PREFIX_REASONS: tuple[tuple[str, str], ...] = (
    ("--memory", _LIMITS),  # --memory, --memory-swap, --memory-reservation, --memory-swappiness
    ("--cpu", _LIMITS),  # --cpus, --cpu-shares, --cpu-period, --cpu-quota, --cpuset-*, --cpu-rt-*
    ("--blkio", _LIMITS),
    ("--device-read", _LIMITS),
    ("--device-write", _LIMITS),
    ("--dns", _NETWORK),
)
# Short flags: the first two characters (Docker accepts "-vX" as well as "-v X").
_SHORT_REASONS: dict[str, str] = {
    "-v": _MOUNTS,
    "-e": _ENV,
    "-u": _USER,
    "-m": _LIMITS,
    "-c": _LIMITS,
    "-p": _NETWORK,
    "-P": _NETWORK,
    "-w": _WORKDIR,
    "-l": _LABEL_SHAPE,
}


def extra_flag_refusal(flag: str) -> tuple[str, str] | None:
    """``(flag name, reason)`` if ``flag`` is refused, ``None`` for a well-formed label.

    Only the flag's *name* is reported: an ``--env=TOKEN=secret`` must not echo its value
    into logs just because it was refused.
    """
    if not flag.startswith("-"):
        return "(not a flag)", f"not a flag; {ONLY_LABELS}"
    if flag.startswith("--"):
        name, eq, value = flag.partition("=")
        if name == "--label":
            if not eq:
                return name, _LABEL_SHAPE
            key, sep, _ = value.partition("=")
            if not sep or not key:
                return name, f"{_LABEL_SHAPE} (key must not be empty)"
            return None
        reason = _LONG_REASONS.get(name)
        if reason is None:
            for prefix, family_reason in _PREFIX_REASONS:
                if name.startswith(prefix):
                    reason = family_reason
                    break
        return name, reason or ONLY_LABELS
    name = flag[:2]
    return name, _SHORT_REASONS.get(name, ONLY_LABELS)


def parse_extra_flags(flags: Sequence[str], field: str = "extra_flags") -> dict[str, str]:
    """The labels carried by ``--label=key=value`` flags; any other flag is a SpecError.

    The lease label is reserved (a flag must not claim a container for another lease), and
    one key set twice with different values is refused rather than silently resolved.
    """
    if not isinstance(flags, list | tuple):
        raise SpecError(field, "must be a list of strings")
    labels: dict[str, str] = {}
    for index, flag in enumerate(flags):
        where = f"{field}[{index}]"
        if not isinstance(flag, str):
            raise SpecError(where, "must be a string")
        if has_control(flag):
            raise SpecError(where, "must not contain control characters")
        refusal = extra_flag_refusal(flag)
        if refusal is not None:
            name, reason = refusal
            raise SpecError(where, f"{name} is refused: {reason}")
        key, _, value = flag.removeprefix("--label=").partition("=")
        if key in RESERVED_LABELS:
            raise SpecError(where, f"label {key!r} is reserved for sbxkit")
        if key in labels and labels[key] != value:
            raise SpecError(where, f"label {key!r} is set twice with different values")
        labels[key] = value
    return labels


def merge_labels(
    labels: Mapping[str, str], flag_labels: Mapping[str, str], field: str = "extra_flags"
) -> dict[str, str]:
    """``labels`` plus the ones from extra flags; a key both set differently is refused."""
    merged = dict(labels)
    for key, value in flag_labels.items():
        if key in merged and merged[key] != value:
            raise SpecError(
                field, f"label {key!r} is set in labels and in extra_flags with different values"
            )
        merged[key] = value
    return merged


# --- networking --------------------------------------------------------------------------------

NETWORKS = ("none", "bridge", "managed")
HOST_GATEWAY_ALIAS = "host.docker.internal:host-gateway"
"""The bridge's route back to the host, named the way Docker Desktop and Linux both resolve."""


def check_network(network: object, environment: bytes | str | None) -> None:
    """Refuse networking the policy forbids; parse ``SBXKIT_ENV`` only when a routed network
    (``bridge``, ``managed``) is asked for.

    ``network`` is a mode (``none``, ``bridge``, ``managed``) or a governed-network table
    (``sbxkit._model.network_terms.Network``), checked by its own rules. ``environment`` is the raw
    ``SBXKIT_ENV`` (bytes, as ``os.environb`` holds it). An unknown or non-UTF-8 value is an
    error only here, where it decides something: a typo must not turn production into
    development.
    """
    if isinstance(network, Network):
        check_network_spec(network)
        _check_ports_beyond_loopback(network, environment)
    elif network not in NETWORKS:
        if not isinstance(network, str):
            raise SpecError("network", "must be 'none', 'bridge', 'managed' or a table")
        if network == "host":
            raise SpecError("network", "host networking is refused: it shares the host's network")
        if network.startswith("container:"):
            raise SpecError(
                "network",
                "container:* is refused: it shares another container's network namespace",
            )
        raise SpecError("network", f"must be 'none', 'bridge' or 'managed', got {network!r}")
    mode = network_mode(network)
    if mode == "none":
        return
    try:
        kind: EnvKind = parse_environment(environment)
    except SpecError as error:
        raise SpecError(
            error.field, f"{error.rule} (it decides whether network={mode!r} is allowed)"
        ) from None
    if kind == "production":
        raise SpecError(
            "network",
            f"{mode} networking is refused in production (SBXKIT_ENV) for every worker kind: "
            "it routes out of the sandbox; use 'none' with network.allow for governed egress",
        )


def _check_ports_beyond_loopback(network: Network, environment: bytes | str | None) -> None:
    """A forwarded port on an address other than loopback is refused in production."""
    if not (network.ports and network.ports_beyond_loopback):
        return
    try:
        kind: EnvKind = parse_environment(environment)
    except SpecError as error:
        raise SpecError(
            error.field,
            f"{error.rule} (it decides whether network.ports_beyond_loopback is allowed)",
        ) from None
    if kind == "production":
        raise SpecError(
            "network.ports_beyond_loopback",
            "is refused in production (SBXKIT_ENV): a forwarded port stays on the host's loopback",
        )


# --- environment ownership ----------------------------------------------------------------------

ENV_SIZE_LIMIT = 128 * 1024
"""Cap on sum(len(key) + len(value) + 2) in UTF-8 bytes (the '=' and the NUL of envp)."""

RUNTIME_ENV_KEYS = ("SBXKIT_LEASE", "SBXKIT_SANDBOX")
"""Keys sbxkit sets in every sandbox; user and profile values for them are overwritten."""

MAX_LEASE_LENGTH = 128


def runtime_env(lease: str) -> dict[str, str]:
    """The keys the runtime owns for one lease."""
    return {"SBXKIT_LEASE": lease, "SBXKIT_SANDBOX": "1"}


def env_key_problem(key: str) -> str | None:
    """Why ``key`` cannot be an environment variable name, or None if it can."""
    if not key:
        return "key must not be empty"
    if "=" in key:
        return "key must not contain '='"
    if key.startswith("#"):
        return "key must not start with '#'"
    if any(ch.isspace() for ch in key):
        return "key must not contain whitespace"
    if has_control(key):
        return "key must not contain control characters (NUL included)"
    return None


def string_items(mapping: object, field: str) -> Iterator[tuple[str, str, str]]:
    """Each ``(where, key, value)`` of a mapping that must be str → str, refused (naming
    ``field[key]``) at the first item that is not."""
    if not isinstance(mapping, dict):
        raise SpecError(field, "must be a mapping of strings")
    for key, value in mapping.items():
        where = f"{field}[{key!r}]"
        if not isinstance(key, str) or not isinstance(value, str):
            raise SpecError(where, "keys and values must be strings")
        yield where, key, value


def check_env(env: object, field: str = "env") -> dict[str, str]:
    """Refuse a mapping that is not str → str, malformed keys and NUL in values."""
    for where, key, value in string_items(env, field):
        problem = env_key_problem(key)
        if problem is not None:
            raise SpecError(where, problem)
        if "\0" in value:
            raise SpecError(where, "value must not contain NUL")
        check_utf8(key, f"{where} (key)")
        check_utf8(value, where)
    return cast(dict[str, str], env)  # string_items refused anything else


def env_size(env: Mapping[str, str]) -> int:
    """Bytes ``env`` takes in a process's envp: key, '=', value and NUL per entry."""
    return sum(
        len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass")) + 2
        for k, v in env.items()
    )


def check_env_size(env: Mapping[str, str], field: str = "env", reserve: int = 0) -> None:
    """Refuse an environment over ``ENV_SIZE_LIMIT`` (``reserve`` is kept for runtime keys)."""
    size = env_size(env) + reserve
    if size > ENV_SIZE_LIMIT:
        raise SpecError(
            field,
            f"the environment takes {size} bytes (sum of len(key)+len(value)+2, runtime keys "
            f"included); the limit is {ENV_SIZE_LIMIT}",
        )


SCRATCH_HOME = {"HOME": "/tmp"}
"""What a sandbox of its own uid gets as ``HOME`` when neither its spec nor its image sets one
(``sbxkit._plan.policy.with_scratch_home``: the scratch space)."""

RUNTIME_ENV_RESERVE = env_size(runtime_env("x" * MAX_LEASE_LENGTH)) + env_size(SCRATCH_HOME)
"""What sbxkit's keys can take at most (the runtime's, and the scratch ``HOME``): validation
counts it before a lease exists."""


def merge_env(
    *layers: Mapping[str, str],
    runtime: Mapping[str, str],
    field: str = "env",
    owned: Iterable[str] = (),
) -> dict[str, str]:
    """Layers in order (profile/template, then spec), then the runtime's keys, which win.

    ``owned`` keys are the runtime's even where it sets no value (a governed network's proxy
    variables, the callback's): a layer's value for one is dropped. Every layer is checked, so
    a malformed key cannot hide in a layer that a later one overwrites; the merged result must
    fit ``ENV_SIZE_LIMIT``.
    """
    merged: dict[str, str] = {}
    for layer in layers:
        merged.update(check_env(dict(layer), field))
    for key in owned:
        merged.pop(key, None)
    merged.update(check_env(dict(runtime), field))
    check_env_size(merged, field)
    return merged


LIMIT_CONTROLLERS = ("cpu", "memory", "pids")
"""The cgroup controllers that enforce sbxkit's mandatory cpus, memory and pids limits."""


ROOTLESS_WORKS = (
    "use rootless Docker on cgroup v2 with the cpu, memory and pids controllers delegated to "
    "its user and AppArmor hidden from it, rootless Podman on cgroup v2 with them delegated "
    "(one-shot runs and pools: docs/backends.md), a rootful Docker daemon, or rootful Podman"
)
"""What works where a rootless engine is refused: nothing that is refused itself."""


def check_podman_controllers(controllers: Iterable[str], *, rootless: bool, version: str) -> bool:
    """Refuse a Podman service that cannot enforce the mandatory limits, before any container;
    True when the host must set the sandbox's rlimits itself (``sbxkit._kernel.rlimits``).

    Rootless Podman on cgroup v1 gets no delegated controllers: it creates the container and
    silently drops the memory, CPU and pids limits (its compat ``/info`` still claims them),
    so it is refused. On cgroup v2, with the controllers delegated, rootless Podman (4.3)
    holds those but drops ``HostConfig.Ulimits``: the host sets them on the sandbox's processes
    before its payload runs, and proves them (``/proc/PID/limits``).
    """
    missing = [name for name in LIMIT_CONTROLLERS if name not in set(controllers)]
    kind = "rootless" if rootless else "rootful"
    if missing:
        raise SpecError(
            "limits",
            f"this Podman service ({kind}, cgroup {version or '?'}) has no "
            f"{'/'.join(missing)} cgroup controller, so it would run the sandbox without its "
            f"mandatory limits; {ROOTLESS_WORKS}",
        )
    return rootless


def _security_names(security_options: Iterable[str]) -> set[str]:
    """The ``name=`` of each of a Docker daemon's ``/info`` ``SecurityOptions``."""
    return {option.split(",")[0].removeprefix("name=") for option in security_options}


def check_rootless_docker(
    security_options: Iterable[str],
    *,
    cgroup_version: str,
    memory: bool,
    pids: bool,
    cpu: bool,
) -> None:
    """Refuse a rootless Docker daemon that cannot run a sandbox with its limits, before any
    container (a rootful one passes untouched; pure: its ``/info`` in).

    - cgroup v1 delegates no controllers to a user: a rootless daemon records the memory, CPU
      and pids limits and enforces none of them (inspect still shows them).
    - On cgroup v2 it enforces what its user's manager delegates (``MemoryLimit``,
      ``PidsLimit``, ``CpuCfsQuota``); a limit whose controller is missing would be dropped.
    - With AppArmor on, Docker (seen on 20.10) fails every start: it checks its profile in
      ``/sys/kernel/security/apparmor/profiles``, which a rootless daemon cannot read (and it
      applies no AppArmor rootless). A daemon started with securityfs hidden reports no
      AppArmor and runs (docs/backends.md).
    """
    names = _security_names(security_options)
    if "rootless" not in names:
        return
    if cgroup_version != "2":
        raise SpecError(
            "limits",
            f"this Docker daemon is rootless on cgroup v{cgroup_version or '?'}, where a user "
            "gets no cgroup controllers: it would run the sandbox without its memory, CPU and "
            f"pids limits; {ROOTLESS_WORKS}",
        )
    held = {"cpu": cpu, "memory": memory, "pids": pids}
    missing = [name for name in LIMIT_CONTROLLERS if not held[name]]
    if missing:
        raise SpecError(
            "limits",
            f"this rootless Docker daemon (cgroup v2) has no {'/'.join(missing)} controller "
            "delegated, so it would run the sandbox without that limit; delegate them to its "
            "user (systemd: Delegate=cpu memory pids for user@.service), or use a rootful "
            "Docker daemon or rootful Podman",
        )
    if "apparmor" in names:
        raise SpecError(
            "limits",
            "this rootless Docker daemon reports AppArmor, and then fails every container "
            "start (it cannot read /sys/kernel/security/apparmor/profiles rootless; Docker "
            "applies no AppArmor profile rootless anyway): start it with securityfs hidden "
            "in its mount namespace, or on a kernel booted with apparmor=0 (docs/backends.md)",
        )


ROOT_INSIDE_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SETGID", "CAP_SETUID")
"""What a workspace's root keeps of root's capabilities (all others dropped): what ``apt-get``
and ``dpkg`` need to own, read and write the files of other ids and to drop to them."""

PODMAN_AUTO_WITNESS = "userns-auto"
"""The witness of a rootful Podman service's workspace: the body asks Podman for a user
namespace of the container's own (``PODMAN_AUTO_USERNS``)."""

PODMAN_AUTO_USERNS = "auto:size=65536"
"""``HostConfig.UsernsMode`` of a workspace's root on rootful Podman (``--userns=auto``): ids
taken from the ``containers`` user's subordinate range, apart from every other container of the
service. The size is pinned: left to Podman it follows the highest id the image's files use
(65535 for the test images, 1024 for an image of root's files only), and an id outside the map
cannot be taken (``setuid``, ``chown``); 65536 maps every 16-bit id, ``nobody`` included, as
``userns-remap`` does."""

ROOT_INSIDE_WITNESSES = ("userns", "rootless", "gvisor", PODMAN_AUTO_WITNESS)
"""Where root inside is not root on the host: a daemon that remaps user namespaces
(``userns-remap``), a rootless engine, gVisor (the payload's system calls reach gVisor's
kernel, whose host processes run unprivileged in a user namespace of their own), or rootful
Podman asked for a user namespace per container (``PODMAN_AUTO_USERNS``)."""

ROOT_INSIDE_REFUSED = (
    "root inside would be root on the host here: this daemon runs containers in the host's "
    "user namespace, with a runtime whose kernel is the host's. Use a daemon started with "
    "--userns-remap, a rootless engine, rootful Podman (a user namespace per container), or "
    "runtime = 'gvisor' (runsc)"
)

PODMAN_ROOT_REFUSED = (
    "root inside would be root on the host here: rootful Podman runs a container in the "
    f"host's user namespace unless HostConfig.UsernsMode is {PODMAN_AUTO_USERNS!r} (a user "
    "namespace of the container's own, which sbxkit asks for a workspace)"
)
