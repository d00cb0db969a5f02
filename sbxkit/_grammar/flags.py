"""One flag table for ``run``, ``shell`` and ``batch``: the sandbox flags, their parsing into a
``SandboxSpec`` (a profile's values are defaults, explicit flags win) and the one ``IMAGE -- CMD``
positional."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import msgspec

from sbxkit._grammar.common import subcommand_parser
from sbxkit._grammar.docker_habits import (
    NAME_LABEL,
    env_file_pairs,
    mounts_from_args,
    user_flag,
)
from sbxkit._grammar.profile import Profile, apply_profile
from sbxkit._model.gpu import GpuRequest
from sbxkit._model.network_inject import InjectRule, parse_inject_flag
from sbxkit._model.network_terms import CallbackTls, Network
from sbxkit._model.spec import Limits, SandboxSpec, Workspace, check_limit
from sbxkit._model.units import parse_duration, parse_size
from sbxkit._util.argtypes import ascii_float, ascii_int
from sbxkit._util.environment import caller_environ
from sbxkit.errors import SpecError

LIMIT_FLAGS: tuple[tuple[str, str, str, str], ...] = (
    ("cpus", "--cpus", "cpus", "float"),
    ("memory", "--memory", "memory_bytes", "size"),
    ("pids", "--pids", "pids", "int"),
    ("max_output", "--max-output", "output_bytes", "size"),
    ("timeout", "--timeout", "timeout_s", "duration"),
    ("fsize", "--fsize", "fsize_bytes", "size"),
    ("scratch", "--scratch", "scratch_bytes", "size"),
    ("shm", "--shm", "shm_bytes", "size"),
    ("max_transfer", "--max-transfer", "transfer_bytes", "size"),
    ("max_transfer_entries", "--max-transfer-entries", "transfer_entries", "int"),
)
"""(argparse dest, flag, ``Limits`` field, kind): the limits a flag sets; sizes and durations
are read by ``sbxkit/_model/units.py``."""

DEFAULTS = {"cpus": "1", "memory": "256m", "pids": "128", "max_output": "1m", "timeout": "30"}


def _number(text: str, field: str, kind: type[int] | type[float]) -> float:
    """ASCII digits only (sbxkit/_util/argtypes.py): ``--pids ١٢`` is refused, not read as 12."""
    try:
        return ascii_int(text) if kind is int else ascii_float(text)
    except ValueError:
        raise SpecError(field, f"expected a number of ASCII digits, got {text!r}") from None


def env_flags(pairs: Sequence[str]) -> dict[str, str]:
    """``K=V`` sets a value; a bare ``K`` passes the host's value, by name only."""
    env: dict[str, str] = {}
    host = caller_environ()  # this process's, or a handed-off run's caller's (sbxkit.handoff)
    for item in pairs:
        key, eq, value = item.partition("=")
        if not eq:
            if key not in host:
                raise SpecError(f"--env {key}", "bare names pass the host value, but it is unset")
            value = host[key]
        env[key] = value
    return env


def _labels(pairs: Sequence[str]) -> dict[str, str]:
    """``--label K=V``; the value may be empty, the key may not."""
    labels: dict[str, str] = {}
    for item in pairs:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SpecError(f"--label {item}", "expected KEY=VALUE")
        labels[key] = value
    return labels


def _workspace(args: argparse.Namespace, base: Workspace | None) -> Workspace | None:
    """``--workspace``, ``--disk SIZE`` and ``--exec-tmp`` on top of the profile's workspace;
    the last two need a workspace (a flag or the profile's) to bound or to open."""
    disk, exec_tmp = getattr(args, "disk", None), getattr(args, "exec_tmp", False)
    if getattr(args, "workspace", False):
        base = base or Workspace()
    if base is None:
        for flag, given in (("--disk", disk is not None), ("--exec-tmp", exec_tmp)):
            if given:
                raise SpecError(
                    flag,
                    "applies to a workspace: add --workspace (or a profile's "
                    "[sandbox.docker.workspace])",
                )
        return None
    if disk is not None:
        base = msgspec.structs.replace(base, disk_bytes=parse_size(disk, "--disk"))
    if exec_tmp:
        base = msgspec.structs.replace(base, exec_tmp=True)
    return base


def _gpus(text: str) -> GpuRequest:
    """``--gpus N`` asks for N GPUs chosen round-robin; ``--gpus ID[,ID...]`` names CDI devices."""
    stripped = text.strip()
    if stripped.isascii() and stripped.isdigit():
        if len(stripped) > 4:
            raise SpecError("--gpus", f"a count must be at most 9999, got {stripped!r}")
        return GpuRequest(count=int(stripped))
    return GpuRequest(devices=[part.strip() for part in stripped.split(",")])


def _port_changes(args: argparse.Namespace) -> dict[str, Any]:
    """What ``--port`` and ``--port-beyond-loopback`` change in the network table (each
    replaces that part of a profile's), checked where the spec is (network_ports.py)."""
    changes: dict[str, Any] = {}
    ports = getattr(args, "port", None) or []
    if ports:
        changes["ports"] = list(ports)
    if getattr(args, "port_beyond_loopback", False):
        changes["ports_beyond_loopback"] = True
    return changes


def _network(args: argparse.Namespace, base: str | Network) -> str | Network | None:
    """The governed network ``--allow``, ``--callback``, ``--tls-*`` and ``--port`` describe
    over the profile's (each given flag replaces that part of it), or None when none was
    given."""
    allow = getattr(args, "allow", None) or []
    callback = getattr(args, "callback", None)
    tls = {name: getattr(args, f"tls_{name}", None) for name in ("ca", "cert", "key")}
    inject = _inject_flags(args)
    port_changes = _port_changes(args)
    if not allow and callback is None and not any(tls.values()) and not inject and not port_changes:
        return None
    mode = getattr(args, "network", None) or (base if isinstance(base, str) else base.mode)
    if mode not in ("none", "managed"):
        raise SpecError("--allow", f"a governed network needs --network none, not {mode}")
    network = base if isinstance(base, Network) else Network(mode="none")
    changes: dict[str, Any] = {"mode": mode, **port_changes}
    if allow:
        changes["allow"] = list(allow)
    if callback is not None:
        changes["callback"] = callback
    if any(tls.values()):
        if tls["ca"] is None:
            raise SpecError("--tls-ca", "the client TLS bundle starts with its CA (--tls-ca)")
        changes["tls"] = CallbackTls(ca=tls["ca"], cert=tls["cert"], key=tls["key"])
    if inject:
        changes["inject"] = inject
    return msgspec.structs.replace(network, **changes)


def _inject_flags(args: argparse.Namespace) -> list[InjectRule]:
    """``--inject HOST:HEADER=env:NAME`` rules (they replace the profile's list)."""
    return [parse_inject_flag(text) for text in getattr(args, "inject", None) or []]


def limit_value(text: str, flag: str, kind: str) -> int | float:
    """A limit flag's value: sizes and durations as ``sbxkit/_model/units.py`` reads them (``1.5g``,
    ``5m``), other numbers of ASCII digits."""
    if kind == "size":
        return parse_size(text, flag)
    if kind == "duration":
        return parse_duration(text, flag)
    if kind == "int":
        return int(_number(text, flag, int))
    return _number(text, flag, float)


def check_limit_flag(field: str, value: int | float, flag: str, text: str) -> None:
    """Refuse a flag's bad limit naming the flag (``--memory``), not the spec field."""
    try:
        check_limit(field, value, flag)
    except SpecError as exc:
        digits = text.strip()
        if digits.isascii() and digits.isdigit() and int(digits) > 0 and field.endswith("_bytes"):
            hint = f"{exc.rule}; a bare number is bytes (did you mean {text.strip()}m?)"
            raise SpecError(flag, hint) from None
        raise


def spec_from_args(
    args: argparse.Namespace,
    profile: Profile | None = None,
    *,
    defaults: Mapping[str, str] = DEFAULTS,
    default_command: Sequence[str] = (),
) -> SandboxSpec:
    """The spec the flags describe: a profile's values are defaults, explicit flags win, and
    ``defaults`` fill any mandatory limit neither set. Shared by ``run`` and ``shell``; flags a
    command does not define count as not given."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    command = command or list(default_command)
    if getattr(args, "entrypoint", None):
        command = [args.entrypoint, *command]  # docker's: the entrypoint, the command its args
    if profile is not None:
        base, _, _ = apply_profile(profile, command, image=args.image)
    else:
        if args.image is None:
            raise SpecError("IMAGE", "required (or --profile FILE naming an image)")
        # Partial on purpose: the flags and defaults below fill the mandatory limits.
        base = SandboxSpec(image=args.image, command=command, limits=msgspec.convert({}, Limits))
    limits: dict[str, Any] = {}
    for dest, flag, field, kind in LIMIT_FLAGS:
        given = getattr(args, dest, None)  # a command without the flag: not given
        if given is not None:
            limits[field] = limit_value(given, flag, kind)
            check_limit_flag(field, limits[field], flag, given)
        elif getattr(base.limits, field) is None and dest in defaults:
            limits[field] = limit_value(defaults[dest], flag, kind)
    overrides: dict[str, Any] = {
        "limits": msgspec.structs.replace(base.limits, **limits),
        "env": {
            **base.env,
            **env_flags(env_file_pairs(getattr(args, "env_file", None) or [])),
            **env_flags(getattr(args, "env", None) or []),
        },
        "labels": {**base.labels, **_labels(getattr(args, "label", None) or [])},
    }
    if getattr(args, "name", None):  # docker's --name: sbxkit names containers by lease
        overrides["labels"][NAME_LABEL] = args.name
    mounts = mounts_from_args(args)
    if mounts:
        overrides["mounts"] = [*base.mounts, *mounts]
    if getattr(args, "user", None):
        overrides["user"] = user_flag(args.user)
    for dest in ("workdir", "runtime", "network"):
        if getattr(args, dest, None) is not None:
            overrides[dest] = getattr(args, dest)
    if getattr(args, "gpus", None) is not None:
        overrides["gpus"] = _gpus(args.gpus)
    workspace = _workspace(args, base.workspace)
    if workspace is not None:
        overrides["workspace"] = workspace
    network = _network(args, overrides.get("network", base.network))
    if network is not None:
        overrides["network"] = network
    return msgspec.structs.replace(base, **overrides)


class ImageAndCommand(argparse.Action):
    """``IMAGE [-- CMD...]``, or ``-- CMD...`` alone with ``--profile`` naming the image.

    Everything after IMAGE belongs to the command, a leading ``--`` included: ``spec_from_args``
    drops exactly one (so ``IMAGE -- -- x`` runs ``-- x``, in run and shell alike). Options
    precede this positional (it swallows everything), so ``--profile`` is known when this runs
    — except flags between IMAGE and a later ``--`` (``IMAGE --json -- echo hi``): they are
    recorded in ``flags_after_image`` for ``parse_with_flags_after_image`` to read as flags.
    Without a ``--``, a command whose first word is a flag is refused, not run.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        rest = [str(v) for v in values or []]
        namespace.image_and_command = list(rest)
        image: str | None = None
        if rest and rest[0] != "--":
            image, rest = rest[0], rest[1:]
        if image is None and namespace.profile is None:
            raise argparse.ArgumentError(
                self, "IMAGE is required (or --profile FILE whose profile names an image)"
            )
        namespace.flags_after_image = []
        if rest and rest[0].startswith("-") and rest[0] != "--":
            if "--" not in rest:
                raise argparse.ArgumentError(
                    self,
                    f"{rest[0]} after IMAGE would be the command: put sbxkit's flags before "
                    "IMAGE (or before a --), and the command after --",
                )
            namespace.flags_after_image = rest[: rest.index("--")]
        namespace.image = image
        namespace.command = rest


def parse_with_flags_after_image(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[argparse.Namespace, list[str]]:
    """``parser.parse_known_args(argv)``, reading the flags between IMAGE and ``--`` as flags:
    ``IMAGE --json -- echo hi`` parses as ``--json IMAGE -- echo hi``. A word there that is
    neither a flag nor a flag's value is a usage error naming it (exit 2); an unknown flag is
    left in the unknown list for the caller's usage error, as anywhere else."""
    args, unknown = parser.parse_known_args(argv)
    moved: list[str] = getattr(args, "flags_after_image", [])
    if not moved:
        return args, unknown
    tail: list[str] = args.image_and_command
    image, after = tail[0], tail[len(moved) + 2 :]
    reordered = [*argv[: len(argv) - len(tail)], *moved, image, "--", *after]
    args, unknown = parser.parse_known_args(reordered)
    if args.image != image and not unknown:  # an unknown flag took it: that is the error
        stray = next((word for word in moved if word == args.image), args.image)
        subcommand_parser(parser, getattr(args, "action", "")).error(
            f"between IMAGE and --, {stray!r} is neither a flag nor a flag's value "
            "(the command goes after --)"
        )
    return args, unknown


def image_usage(command: str, tail: str = "") -> str:
    """The usage of a subcommand that takes an image: named, or optional with a profile
    (which may name it); ``tail`` is what follows the image."""
    return (
        f"sbxkit {command} [options] IMAGE{tail}\n"
        f"       sbxkit {command} --profile FILE [options] [IMAGE]{tail}"
    )


def add_sandbox_flags(
    parser: argparse.ArgumentParser,
    defaults: Mapping[str, str],
    *,
    profile_help: str,
    output_help: str,
    timeout_help: str,
    network_help: str,
) -> None:
    """The flags ``run`` and ``shell`` share (a command adds its own after these)."""
    parser.add_argument("--profile", metavar="FILE", help=profile_help)
    parser.add_argument("--cpus", help=f"CPU quota (default: {defaults['cpus']})")
    parser.add_argument(
        "-m", "--memory", help=f"memory ceiling, no swap: 64m, 1.5g (default: {defaults['memory']})"
    )
    parser.add_argument("--pids", help=f"process count ceiling (default: {defaults['pids']})")
    parser.add_argument("--max-output", help=f"{output_help} (default: {defaults['max_output']})")
    parser.add_argument(
        "--timeout", help=f"{timeout_help}: 30, 0.5, 500ms, 5m, 1h (default: {defaults['timeout']})"
    )
    parser.add_argument("--fsize", help="per-file size ceiling (default: 64m)")
    parser.add_argument("--scratch", help="size of the /tmp tmpfs (default: 64m)")
    parser.add_argument("--shm", help="size of the /dev/shm tmpfs (default: 64m)")
    parser.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="set a variable; a bare K passes the host's value",
    )
    parser.add_argument(
        "-u",
        "--user",
        help="UID[:GID], non-root; UID alone means UID:UID (default: a uid of the "
        "sandbox's own, docs/security.md)",
    )
    parser.add_argument("-w", "--workdir", help="absolute working directory")
    parser.add_argument("--network", choices=["none", "bridge", "managed"], help=network_help)
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="governed egress: the sandbox reaches HOST through sbxkit's proxy on its own "
        "loopback (repeatable; *.DOMAIN, an address; no port means 80 and 443; "
        "docs/network.md)",
    )
    parser.add_argument(
        "--callback",
        metavar="URL",
        help="http(s)://HOST:PORT on the host, reached from inside as $SBXKIT_ENDPOINT",
    )
    parser.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="HOST:HEADER=env:NAME|file:PATH",
        help="the proxy sets HEADER on requests to HOST (an allowed host) from a host variable "
        "or a 0600 file; the value never enters the sandbox (repeatable; docs/network.md)",
    )
    parser.add_argument("--tls-ca", metavar="FILE", help="an https callback's CA (client bundle)")
    parser.add_argument("--tls-cert", metavar="FILE", help="an https callback's client certificate")
    parser.add_argument("--tls-key", metavar="FILE", help="an https callback's client key")
    add_port_flags(parser)
    parser.add_argument("--socket", help="Docker socket path (default: discovered)")


def add_port_flags(parser: argparse.ArgumentParser) -> None:
    """Inbound ports (docs/network.md, "Inbound ports")."""
    parser.add_argument(
        "--port",
        action="append",
        default=[],
        metavar="[ADDR:][HOST_PORT:]PORT",
        help="forward the host's 127.0.0.1:HOST_PORT (a free one if omitted) to the sandbox's "
        "own 127.0.0.1:PORT, for the owner's account only (repeatable; docs/network.md)",
    )
    parser.add_argument(
        "--port-beyond-loopback",
        action="store_true",
        help="let --port name a host address other than loopback (refused in production)",
    )


def add_kind_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that choose what kind of sandbox a command gets (``run`` and ``open``)."""
    parser.add_argument(
        "--runtime",
        help="OCI runtime registered in the daemon; gvisor means runsc (default: crun where "
        "a runc-default Docker daemon registers it, else the daemon's default)",
    )
    parser.add_argument(
        "-l", "--label", action="append", default=[], metavar="K=V", help="add a container label"
    )
    parser.add_argument(
        "--workspace",
        action="store_true",
        help="a workspace: root inside, only where it is not root on the host (a userns-remap "
        "or rootless daemon, rootful Podman, or --runtime gvisor; docs/workspace.md)",
    )
    parser.add_argument(
        "--disk",
        metavar="SIZE",
        help="a workspace's image filesystem writable, bounded at SIZE written (e.g. 2g): "
        "past it, writes fail or the run ends disk_exceeded (docs/workspace.md)",
    )
    parser.add_argument(
        "--exec-tmp",
        action="store_true",
        help="a workspace's /tmp may hold programs that run (noexec otherwise)",
    )
    parser.add_argument(
        "--gpus",
        metavar="N|CDI-ID[,...]",
        help="N GPUs chosen round-robin from the daemon's CDI devices, or explicit CDI names",
    )


SPEC_FLAGS: tuple[tuple[str, str], ...] = (
    *((f"limits.{field}", flag) for _, flag, field, _ in LIMIT_FLAGS),
    ("network.allow", "--allow"),
    ("network.callback", "--callback"),
    ("network.inject", "--inject"),
    ("network.tls.ca", "--tls-ca"),
    ("network.tls.cert", "--tls-cert"),
    ("network.tls.key", "--tls-key"),
    ("network.tls", "--tls-ca/--tls-cert/--tls-key"),
    ("network.ports_beyond_loopback", "--port-beyond-loopback"),
    ("network.ports", "--port"),
    ("network", "--network"),
    ("workspace.exec_tmp", "--exec-tmp"),
    ("mounts", "-v/--mount"),
    ("workspace.disk_bytes", "--disk"),
    ("workspace", "--workspace"),
    ("user", "--user"),
    ("workdir", "--workdir"),
    ("runtime", "--runtime"),
    ("labels", "--label"),
    ("env", "--env"),
    ("gpus.count", "--gpus"),
    ("gpus.devices", "--gpus"),
    ("gpus", "--gpus"),
    ("image", "IMAGE"),
    ("command", "CMD"),
)
"""A spec field → the flag a command-line user typed for it: the field itself, or one item of
it (``[i]``); a field no flag sets keeps its own name (``network.max_connections``)."""


def flag_for(field: str) -> str:
    """The flag naming ``field`` (``limits.output_bytes`` → ``--max-output``,
    ``network.allow[0]`` → ``--allow[0]``), or ``field`` when no flag sets it."""
    for prefix, flag in SPEC_FLAGS:
        if field == prefix:
            return flag
        if field.startswith(prefix + "["):  # which one stays said: --env['K'], CMD[1]
            rest = field[len(prefix) :]
            return flag + (rest.split("].", 1)[0] + "]" if "]." in rest else rest)
    return field


@contextmanager
def flags_in_errors(args: argparse.Namespace) -> Iterator[None]:
    """Re-raise a spec rule's ``SpecError`` naming the flag, where no profile is in play (a
    profile's fields are named by their own path already)."""
    try:
        yield
    except SpecError as error:
        if getattr(args, "profile", None) is not None:
            raise
        flag = flag_for(error.field)
        if flag == error.field:
            raise
        raise SpecError(flag, error.rule) from None
