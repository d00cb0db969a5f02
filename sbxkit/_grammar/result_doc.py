"""One JSON shape for a run's result: ``sbxkit run --json``'s document and ``sbxkit batch``'s
result line share it key for key (docs/cli.md, "Results as JSON").

A result (``ResultDoc``) has every key of it but ``id`` (batch lines only) and ``node`` and
``attempt`` (cluster lines only). Its output is ``stdout`` and ``stderr`` (UTF-8 with
replacement), or, under ``--output-encoding base64``, ``stdout_base64`` and ``stderr_base64``
(the bytes exactly); ``error`` is null. An error (``ErrorResultDoc``) is ``status: "error"``
(a cluster's lost attempt: ``"lost"``), ``error`` the object ``{"type", "message", "field"}``,
``container_id``, ``lease`` and ``timings``; ``run --json`` adds ``exit_status``.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import msgspec

from sbxkit._consumers.harness import JobId
from sbxkit._model.result import RunResult, json_fields

__all__ = [
    "OUTPUT_ENCODINGS",
    "ErrorDoc",
    "ErrorResultDoc",
    "OutputEncoding",
    "ResultDoc",
    "result_doc",
]

OutputEncoding = Literal["utf-8", "base64"]
OUTPUT_ENCODINGS: tuple[OutputEncoding, ...] = ("utf-8", "base64")


class ErrorDoc(msgspec.Struct, kw_only=True):
    """Why there is no result: the error's class name, its message, and the field or flag it
    names (None when it names none)."""

    type: str
    message: str
    field: str | None = None


class ResultDoc(msgspec.Struct, kw_only=True):
    """``sbxkit run --json``'s document and ``sbxkit batch``'s line (``id`` first: a torn line
    of ours is recognised by its start, sbxkit/cli/results.py)."""

    id: JobId | msgspec.UnsetType = msgspec.UNSET
    status: str
    exit_code: int | None = None
    stdout: str | msgspec.UnsetType = msgspec.UNSET
    stderr: str | msgspec.UnsetType = msgspec.UNSET
    stdout_base64: str | msgspec.UnsetType = msgspec.UNSET
    stderr_base64: str | msgspec.UnsetType = msgspec.UNSET
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    overflowed: str | None = None
    container_id: str | None = None
    lease: str | None = None
    oom_evidence: str | None = None
    kill_evidence: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, float] = msgspec.field(default_factory=dict)
    pooled: bool = False
    evidence: str | None = None
    denials: list[dict[str, Any]] = msgspec.field(default_factory=list)
    ports: list[dict[str, Any]] = msgspec.field(default_factory=list)
    error: None = None
    node: str | msgspec.UnsetType | None = msgspec.UNSET
    """Cluster batches only (``--ray``): the node the attempt ran on, and which attempt it was."""
    attempt: int | msgspec.UnsetType = msgspec.UNSET


class ErrorResultDoc(msgspec.Struct, kw_only=True):
    """A run that has no result, in both places (``id`` first, as ``ResultDoc``)."""

    id: JobId | msgspec.UnsetType = msgspec.UNSET
    status: str = "error"
    container_id: str | None = None
    lease: str | None = None
    timings: dict[str, float] = msgspec.field(default_factory=dict)
    error: ErrorDoc
    exit_status: int | msgspec.UnsetType = msgspec.UNSET
    """``sbxkit run --json`` only: the exit status the command gives the error."""
    node: str | msgspec.UnsetType | None = msgspec.UNSET
    attempt: int | msgspec.UnsetType = msgspec.UNSET


def result_doc(result: RunResult, encoding: OutputEncoding = "utf-8") -> ResultDoc:
    """``result`` as the shared document; its output as ``encoding`` says."""
    fields: dict[str, Any] = json_fields(result)
    if encoding == "base64":
        del fields["stdout"], fields["stderr"]
        fields["stdout_base64"] = base64.b64encode(result.stdout).decode("ascii")
        fields["stderr_base64"] = base64.b64encode(result.stderr).decode("ascii")
    return ResultDoc(**fields)
