"""What the operator's profile lets a model have, applied to each tool call (pure).

The profile decides; a tool call only chooses within it:

- **images**: one of ``[mcp] images`` (or ``sandbox.docker.image`` alone when that list is
  empty); anything else is refused naming the allow-list;
- **limits**: ``[sandbox.docker.limits]`` are ceilings and defaults at once: all five
  mandatory ones must be set there, and a call may lower any limit, never raise one;
- **everything else** — user, network, runtime, mounts, labels, GPUs, the hardening itself —
  comes from the profile alone: no tool argument names it (``sbxkit.mcp.arguments`` refuses
  unknown keys), and the spec built here is validated by the same rules as any other;
- **env**: a call may add variables, never change one the profile sets.

Each request is checked whole before the hub creates anything.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sbxkit._grammar.mcp_options import McpOptions, file_bytes
from sbxkit._grammar.profile import (
    LIMIT_FIELDS,
    ROOT,
    Profile,
    ProfileLimits,
    apply_profile,
    profile_limits,
)
from sbxkit._model.settings import Settings
from sbxkit._model.spec import MANDATORY_LIMITS, Limits, MiB, SandboxSpec, check_limit, parse_size
from sbxkit._model.spec import validate_spec as validate_spec
from sbxkit.errors import SpecError
from sbxkit.mcp.arguments import (
    ExecArgs,
    OpenArgs,
    RunArgs,
    run_files,
    text_bytes,
)

DEFAULT_WORKDIR = "/tmp"
"""Where commands start unless the profile names a workdir: the scratch tmpfs, where files
are written (as for Inspect's samples, docs/inspect.md)."""
PLACEHOLDER_COMMAND = ["true"]
"""A session's own command is replaced by a keep-alive (``sbxkit._consumers.session``)."""

SANDBOX_LIMIT = "this sandbox's"  # its limits.timeout and limits.max_output, set at sandbox_open
_NAME_OF = {field: name for name, (field, _) in LIMIT_FIELDS.items()}
"""``Limits`` field → the name a profile and a tool call use (``memory_bytes`` → ``memory``)."""
_SIZES = {field for field, is_size in LIMIT_FIELDS.values() if is_size}


class McpPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The profile, as a server applies it to every call."""

    base: SandboxSpec
    """The profile's spec: default image, the ceilings as its limits, env, mounts, network."""
    settings: Settings
    images: tuple[str, ...]
    options: McpOptions
    file_bytes: int

    @property
    def ceilings(self) -> Limits:
        return self.base.limits


class RunRequest(msgspec.Struct, frozen=True, kw_only=True):
    spec: SandboxSpec
    stdin: bytes | None
    files: dict[str, bytes] | None


class OpenRequest(msgspec.Struct, frozen=True, kw_only=True):
    spec: SandboxSpec
    """The session's spec: its ``limits.timeout_s`` is the sandbox's lifetime."""
    command_limits: Limits
    """Per command in the sandbox: ``timeout_s`` and ``output_bytes`` are each exec's
    default and ceiling."""
    lifetime_s: float


class ExecRequest(msgspec.Struct, frozen=True, kw_only=True):
    command: list[str]
    stdin: bytes | None
    timeout_s: float
    max_output: int
    cwd: str | None
    env: dict[str, str] | None


def show(field: str, value: float) -> str:
    """A limit as an operator wrote it: sizes in MiB when whole, seconds, counts."""
    if field in _SIZES:
        for unit, name in ((MiB, "MiB"), (1024, "KiB")):
            if value % unit == 0:
                return f"{value // unit} {name}"
        return f"{value} bytes"
    if field == "timeout_s":
        return f"{value:g} s"
    return f"{value:g}"


def policy_from_profile(profile: Profile) -> McpPolicy:
    """The server's policy, or a ``SpecError`` naming the profile path that prevents one: the
    sandbox runtime (sessions need Docker), no image, a mandatory limit left unset."""
    if profile.sandbox.runtime != "docker":
        raise SpecError(
            "sandbox.runtime",
            "sbxkit mcp serves Docker sandboxes only (sessions need them): set it to "
            '"docker" or leave it out',
        )
    options = profile.mcp or McpOptions()
    docker = profile.sandbox.docker
    images = tuple(options.images) or ((docker.image,) if docker.image else ())
    if not images:
        raise SpecError(
            "mcp.images",
            f"no image a model may use: list them here (or set {ROOT}.image)",
        )
    if docker.image is not None and docker.image not in images:
        raise SpecError(
            f"{ROOT}.image", f"the default image must be one of mcp.images {list(images)}"
        )
    spec, settings, _ = apply_profile(profile, PLACEHOLDER_COMMAND, image=images[0])
    if docker.image is not None:
        spec = msgspec.structs.replace(spec, image=docker.image)
    missing = [name for name in MANDATORY_LIMITS if getattr(spec.limits, name) is None]
    if missing:
        paths = ", ".join(f"{ROOT}.limits.{_NAME_OF[name]}" for name in missing)
        raise SpecError(
            paths, "mandatory for sbxkit mcp: the ceiling of what a tool call may ask for"
        )
    if spec.workdir is None:
        spec = msgspec.structs.replace(spec, workdir=DEFAULT_WORKDIR)
    validate_spec(spec, settings)
    return McpPolicy(
        base=spec,
        settings=settings,
        images=images,
        options=options,
        file_bytes=file_bytes(options),
    )


def choose_image(policy: McpPolicy, asked: str | None) -> str:
    if asked is None:
        return policy.base.image
    if asked not in policy.images:
        allowed = ", ".join(policy.images)
        raise SpecError("image", f"{asked!r} is not an image the operator allows ({allowed})")
    return asked


def lower_limits(ceilings: Limits, asked: ProfileLimits | None, where: str = "limits") -> Limits:
    """``ceilings`` with the limits a call asks for, each no higher than its ceiling."""
    if asked is None:
        return ceilings
    values: dict[str, Any] = profile_limits(asked, where)
    for field, value in values.items():
        at_most(f"{where}.{_NAME_OF[field]}", field, value, getattr(ceilings, field))
    return msgspec.structs.replace(ceilings, **values)


def at_most(
    where: str, field: str, value: float, cap: float, whose: str = "the operator's"
) -> None:
    """Refuse ``value`` above ``cap``, the limit (a ``Limits`` field) it would raise."""
    if value > cap:
        raise SpecError(
            where,
            f"may lower {whose} limit of {show(field, cap)}, never raise it "
            f"(asked for {show(field, value)})",
        )


def merged_env(base: dict[str, str], asked: dict[str, str] | None) -> dict[str, str]:
    """The profile's env plus a call's; a call never changes what the profile sets."""
    if not asked:
        return dict(base)
    for key in asked:
        if key in base:
            raise SpecError(
                f"env[{key!r}]", "is set by the operator's profile; a tool call cannot change it"
            )
    return {**base, **asked}


def _spec(policy: McpPolicy, **changes: Any) -> SandboxSpec:
    spec = msgspec.structs.replace(policy.base, **changes)
    validate_spec(spec, policy.settings)
    return spec


def run_request(policy: McpPolicy, args: RunArgs) -> RunRequest:
    spec = _spec(
        policy,
        image=choose_image(policy, args.image),
        command=list(args.command),
        limits=lower_limits(policy.ceilings, args.limits),
        env=merged_env(policy.base.env, args.env),
    )
    stdin = None if args.stdin is None else text_bytes(args.stdin, "stdin", policy.file_bytes)
    files = None if args.files is None else run_files(args.files, policy.file_bytes)
    return RunRequest(spec=spec, stdin=stdin, files=files)


def open_request(policy: McpPolicy, args: OpenArgs) -> OpenRequest:
    longest = policy.options.lifetime
    lifetime = longest if args.lifetime is None else args.lifetime
    check_limit("timeout_s", lifetime, "lifetime")
    if lifetime > longest:
        raise SpecError(
            "lifetime",
            f"may shorten the operator's limit of {longest:g} s (mcp.lifetime), never "
            f"lengthen it (asked for {lifetime:g} s)",
        )
    command_limits = lower_limits(policy.ceilings, args.limits)
    spec = _spec(
        policy,
        image=choose_image(policy, args.image),
        command=PLACEHOLDER_COMMAND,
        limits=msgspec.structs.replace(command_limits, timeout_s=float(lifetime)),
        env=merged_env(policy.base.env, args.env),
    )
    return OpenRequest(spec=spec, command_limits=command_limits, lifetime_s=float(lifetime))


def lower_output(raw: int | str | None, cap: int) -> int:
    """A call's ``max_output`` (a size or a byte count), no higher than its sandbox's."""
    if raw is None:
        return cap
    asked = parse_size(raw, "max_output") if isinstance(raw, str) else raw
    check_limit("output_bytes", asked, "max_output")
    at_most("max_output", "output_bytes", asked, cap, SANDBOX_LIMIT)
    return asked


def exec_request(policy: McpPolicy, command_limits: Limits, args: ExecArgs) -> ExecRequest:
    """One command in an open sandbox: its timeout and output cap lower the sandbox's."""
    timeout = command_limits.timeout_s
    if args.timeout is not None:
        check_limit("timeout_s", args.timeout, "timeout")
        at_most("timeout", "timeout_s", args.timeout, timeout, SANDBOX_LIMIT)
        timeout = args.timeout
    max_output = lower_output(args.max_output, command_limits.output_bytes)
    env = None if args.env is None else merged_env(policy.base.env, args.env)
    stdin = None if args.stdin is None else text_bytes(args.stdin, "stdin", policy.file_bytes)
    return ExecRequest(
        command=list(args.command),
        stdin=stdin,
        timeout_s=float(timeout),
        max_output=max_output,
        cwd=args.cwd,
        env=env,
    )
