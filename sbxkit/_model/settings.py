"""Operator settings: what a deployment allows, as opposed to what one sandbox asks for.

Pure data plus the ``SBXKIT_ENV`` parser. ``Settings`` normally comes from a profile's
``[sandbox.docker]`` table; the environment kind comes from ``SBXKIT_ENV``.

``SBXKIT_ENV`` (trimmed, case-insensitive): development|dev|local, staging|stage|preview,
production|prod, test|ci. Unset or empty means development. Anything else — or bytes that are
not UTF-8 — is an error when it matters, i.e. whenever a rule depends on it (bridge
networking): a typo must not silently turn production into development.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from sbxkit._util.public import publish
from sbxkit.errors import SpecError

EnvKind = Literal["development", "staging", "production", "test"]

_ALIASES: dict[str, EnvKind] = {
    "development": "development",
    "dev": "development",
    "local": "development",
    "staging": "staging",
    "stage": "staging",
    "preview": "staging",
    "production": "production",
    "prod": "production",
    "test": "test",
    "ci": "test",
}


def parse_environment(raw: bytes | str | None) -> EnvKind:
    """The environment kind named by a raw ``SBXKIT_ENV`` value."""
    if raw is None:
        return "development"
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SpecError("SBXKIT_ENV", "is not valid UTF-8") from None
    value = raw.strip().lower()
    if not value:
        return "development"
    kind = _ALIASES.get(value)
    if kind is None:
        raise SpecError(
            "SBXKIT_ENV",
            f"unknown value {raw!r}; expected one of "
            "development|dev|local, staging|stage|preview, "
            "production|prod, test|ci",
        )
    return kind


class Settings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """What the operator permits. Everything risky is off by default."""

    enable_bind_mounts: bool = False
    enable_named_volumes: bool = False
    supervisor_state_dir: str | None = None  # bind sources may not overlap it
    supervisor_command: str | None = None
    """The supervisor to launch when none runs for the state dir (an executable plus arguments,
    shell-quoted; it receives ``--state-dir DIR``). None: ``$SBXKIT_SUPERVISOR``, else this
    interpreter's ``sbxkit.supervisor``. Passed explicitly, never through ``os.environ``."""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    """Labels on every container this process creates (an operator's or a CI job's tags; the
    environment's ``SBXKIT_LABELS=k=v,k2=v2`` when empty). They win over a spec's labels; the
    lease label stays reserved."""
    evidence: Literal["auto", "daemon"] = "auto"
    """Which evidence decides a run's exit (docs/security.md): ``auto`` takes the kernel's
    where the host can give it (a pidfd and FIFO EOF) and the daemon's elsewhere; ``daemon``
    always waits for the daemon's answer. The environment's ``SBXKIT_EVIDENCE`` when unset
    here."""
    network_audit_log: str | None = None
    """Where a governed network's decisions go, one JSON line each (an absolute path the
    lease's owner appends to; the environment's ``SBXKIT_NETWORK_AUDIT_LOG`` when None). None
    and unset: nowhere but each run's ``RunResult.denials``."""
    environment: bytes | None = None
    """The raw ``SBXKIT_ENV`` bytes (``os.environb``), read once by the I/O shell
    (``sbxkit._plan.plan.effective_settings``) and parsed only where a rule depends on it (see the
    module doc). None means unset, i.e. development. Bytes, not str: a value that is not UTF-8
    must be refused as such, not decoded into something that merely looks unknown."""


publish(__name__, globals())  # public names show as sbxkit.NAME
