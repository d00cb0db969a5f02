"""``sbxkit batch`` job lines: defaults, CLI-style limit names and sizes, and retrying errors.

Pure helpers (bytes and dicts in, dicts and bytes out) for ``sbxkit/batch.py``, and the one
file rewrite ``--retry-errors`` needs:

- ``normalize_limits``: a job's ``limits`` may use ``Limits``' names (``memory_bytes``,
  ``output_bytes``, ``timeout_s``, …) or the names of ``sbxkit run``'s flags and profiles
  (``memory``, ``max_output``, ``timeout``, ``fsize``, ``scratch``, ``shm``); sizes may be strings
  such as ``"64m"`` or ``"1.5g"``, the time limit such as ``"5m"`` or ``"500ms"``, read as
  ``sbxkit run`` reads them (sbxkit/_model/units.py).
- ``with_defaults``: a job line over the batch's defaults (``--profile`` and flags): a field the
  line gives wins, and ``limits``, ``env`` and ``labels`` merge key by key.
- ``without_error_lines``: RESULTS without the ``error`` lines of the given ids, so
  ``--retry-errors`` re-runs those jobs and leaves one line per id.
"""

from __future__ import annotations

import argparse
import os
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import msgspec

from sbxkit._grammar.flags import DEFAULTS, LIMIT_FLAGS, check_limit_flag, limit_value
from sbxkit._grammar.profile import (
    Profile,
    load_profile,
    profile_limits,
    profile_settings,
    sandbox_options,
)
from sbxkit._model.settings import Settings
from sbxkit._model.spec import SandboxSpec
from sbxkit._model.units import parse_duration, parse_size
from sbxkit._plan.plan import effective_settings
from sbxkit.errors import SpecError

LIMIT_ALIASES = {
    "memory": "memory_bytes",
    "max_output": "output_bytes",
    "timeout": "timeout_s",
    "fsize": "fsize_bytes",
    "scratch": "scratch_bytes",
    "shm": "shm_bytes",
    "max_transfer": "transfer_bytes",
    "max_transfer_entries": "transfer_entries",
}
"""``sbxkit run``/profile names → ``Limits`` names."""

SIZE_FIELDS = frozenset(
    {"memory_bytes", "output_bytes", "fsize_bytes", "scratch_bytes", "shm_bytes", "transfer_bytes"}
)
MERGED_FIELDS = ("limits", "env", "labels")
"""Mappings a job line extends key by key instead of replacing."""

SPEC_FIELDS = frozenset(SandboxSpec.__struct_fields__)
BATCH_LIMIT_FLAGS = tuple(flag for flag in LIMIT_FLAGS if not flag[2].startswith("transfer_"))
"""A job's limits as flags (a job moves no directories: no transfer bounds)."""


def normalize_limits(limits: object, where: str = "limits") -> object:
    """``Limits``' names and byte counts for a job's ``limits`` (see the module doc).

    Anything that is not a mapping is returned as is, for the spec's own decoding to refuse.
    """
    if not isinstance(limits, Mapping):
        return limits
    normalized: dict[str, Any] = {}
    for key, value in limits.items():
        name = LIMIT_ALIASES.get(str(key), str(key))
        if name in normalized:
            raise SpecError(f"{where}.{key}", f"given twice (also as {name!r})")
        if name in SIZE_FIELDS and isinstance(value, str):
            value = parse_size(value, f"{where}.{key}")
        elif name == "timeout_s" and isinstance(value, str):
            value = parse_duration(value, f"{where}.{key}")
        normalized[name] = value
    return normalized


def with_defaults(job: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The job line over the defaults; ``limits``, ``env`` and ``labels`` merge by key."""
    job = {**job}
    if "limits" in job:
        job["limits"] = normalize_limits(job["limits"])
    merged = {**defaults, **job}
    for key in MERGED_FIELDS:
        base, given = defaults.get(key), job.get(key)
        if isinstance(base, Mapping) and isinstance(given, Mapping):
            merged[key] = {**base, **given}
    return merged


def profile_defaults(profile: Profile) -> dict[str, Any]:
    """What a profile gives every job: its ``[sandbox.docker]`` spec fields, limits in
    ``Limits``' names (operator switches and the supervisor go to the settings instead)."""
    docker = profile.sandbox.docker
    fields = msgspec.to_builtins(docker)
    defaults = {
        key: value
        for key, value in fields.items()
        if key in SPEC_FIELDS and key != "limits" and value not in (None, [], {})
    }
    sbx = sandbox_options(profile)
    if "image" not in defaults and sbx is not None and sbx.template is not None:
        defaults["image"] = sbx.template  # the sandbox runtime's image, as for ``sbxkit run``
    limits = profile_limits(docker.limits)
    if limits:
        defaults["limits"] = limits
    return defaults


def without_error_lines(data: bytes, ids: Collection[object]) -> tuple[bytes, int]:
    """RESULTS minus the complete ``error`` lines whose id is in ``ids``; how many went."""
    kept: list[bytes] = []
    dropped = 0
    lines = data.split(b"\n")
    tail = lines.pop()
    for raw in lines:
        if _is_error_line_of(raw, ids):
            dropped += 1
        else:
            kept.append(raw + b"\n")
    return b"".join(kept) + tail, dropped


class _Line(msgspec.Struct):
    id: str | int
    status: str = ""


_LINE = msgspec.json.Decoder(_Line)


def _is_error_line_of(raw: bytes, ids: Collection[object]) -> bool:
    try:
        line = _LINE.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return line.status == "error" and line.id in ids


def forget_error_lines(path: Path, ids: Collection[object]) -> int:
    """Rewrite RESULTS without the ``error`` lines of ``ids`` (atomically: a temporary file
    beside it, fsynced, renamed over it, mode kept). Returns how many lines went; absent
    file: 0. Called only on a file ``prepare_results`` has accepted as results."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise SpecError("--out", f"cannot read {path}: {exc.strerror}") from None
    kept, dropped = without_error_lines(data, ids)
    if dropped:
        target = path.resolve()  # a symlinked RESULTS stays a link to the rewritten file
        temporary = target.with_name(f".{target.name}.retry-{os.getpid()}")
        try:
            with open(temporary, "wb") as handle:
                handle.write(kept)
                handle.flush()
                os.fsync(handle.fileno())
            shutil.copymode(target, temporary)
            os.replace(temporary, target)
        except OSError as exc:
            temporary.unlink(missing_ok=True)
            raise SpecError("--out", f"cannot rewrite {path}: {exc.strerror}") from None
    return dropped


# --- the command line --------------------------------------------------------------------------


def add_valued_flags(parser: argparse.ArgumentParser, *flags: tuple[str, str | None, str]) -> None:
    """Flags that take one value as given: ``(flag, metavar or None, help)`` each."""
    for flag, metavar, text in flags:
        parser.add_argument(flag, metavar=metavar, help=text)


def add_default_flags(parser: argparse.ArgumentParser) -> None:
    """``sbxkit batch``'s job defaults and ``--retry-errors``."""
    add_valued_flags(
        parser,
        (
            "--profile",
            "FILE",
            "TOML profile ([sandbox.docker]) whose image, limits, env, labels and policy are "
            "every job's defaults; the flags below override it, a job line overrides both",
        ),
        ("--image", None, "default image for job lines without one"),
    )
    for dest, flag, _, _ in BATCH_LIMIT_FLAGS:
        default = f"; default {DEFAULTS[dest]}, as sbxkit run's" if dest in DEFAULTS else ""
        parser.add_argument(flag, metavar="VALUE", help=f"every job's {flag[2:]}{default}")
    parser.add_argument(
        "--retry-errors",
        action="store_true",
        help="re-run the jobs whose line in RESULTS is an error (their error line is replaced)",
    )


def defaults_from_args(
    args: argparse.Namespace, profile: Profile | None = None
) -> tuple[dict[str, Any], Settings]:
    """The job defaults and settings ``--profile`` (``profile``, when the caller loaded it
    already), ``--image`` and the limit flags give; a bad flag value is refused naming the
    flag."""
    defaults: dict[str, Any] = {}
    settings: Settings | None = None
    if profile is None and args.profile is not None:
        profile = load_profile(args.profile)
    if profile is not None:
        defaults = profile_defaults(profile)
        settings, _ = profile_settings(profile)  # supervisor.binary rides in the settings
    if args.image is not None:
        defaults["image"] = args.image
    limits = dict(defaults.get("limits", {}))
    for dest, flag, field, kind in BATCH_LIMIT_FLAGS:
        given = getattr(args, dest)
        if given is not None:
            limits[field] = limit_value(given, flag, kind)
            check_limit_flag(field, limits[field], flag, given)
        elif field not in limits and dest in DEFAULTS:  # sbxkit run's, where nothing set it
            limits[field] = limit_value(DEFAULTS[dest], flag, kind)
    if limits:
        defaults["limits"] = limits
    return defaults, effective_settings(settings)
