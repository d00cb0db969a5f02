"""Checked by ``./dev typecheck`` (mypy, strict, unused ignores are errors): each ignore below
must match an error mypy really reports, so if a mandatory limit ever gets a default again —
or ``py.typed`` stops exposing the annotations — this file fails the session."""

from __future__ import annotations

import sbxkit

sbxkit.Limits()  # type: ignore[call-arg]
sbxkit.Limits(cpus=1, memory_bytes=64 * sbxkit.MiB, pids=8, output_bytes=1024)  # type: ignore[call-arg]
sbxkit.Limits(cpus=1, memory_bytes=None, pids=8, output_bytes=1, timeout_s=1)  # type: ignore[arg-type]

complete = sbxkit.Limits(cpus=1, memory_bytes=64 * sbxkit.MiB, pids=8, output_bytes=1, timeout_s=1)
timeout: float = complete.timeout_s  # not Optional: no None check needed
