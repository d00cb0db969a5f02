"""``sbxkit batch``'s status line: done, running, queued, failures, rate and ETA, fitted to the
terminal's width and drawn only on a terminal."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from typing import TextIO

from sbxkit._consumers.harness import JobId, JobResult
from sbxkit.errors import CleanupError

# --- progress ------------------------------------------------------------------------------------


def counted(number: int, noun: str) -> str:
    """``1 error``, ``2 errors``: a count with its noun as English says it."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def format_clock(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_progress(
    *,
    done: int,
    total: int,
    failed: int,
    errors: int,
    ran: int,
    elapsed_s: float,
    running: int = 0,
    width: int | None = None,
) -> str:
    """Running and queued jobs, ``done/total``, failures, this session's rate and the ETA —
    cut to ``width`` columns by dropping the least telling parts from the end."""
    rate = ran / elapsed_s if elapsed_s > 0 and ran else 0.0
    left = total - done
    eta = format_clock(left / rate) if rate > 0 else "?"
    if left == 0:
        eta = "0:00"
    parts = [
        f"{done}/{total} done",
        f"{running} running",
        f"{max(left - running, 0)} queued",
        f"{failed} failed",
        counted(errors, "error"),
        f"{rate:.2f} jobs/s",
        f"ETA {eta}",
    ]
    line = parts[0]
    for part in parts[1:]:
        candidate = f"{line} · {part}"
        if width is not None and len(candidate) > width:
            break
        line = candidate
    return line[:width] if width is not None else line


def is_failure(done: JobResult) -> bool:
    return done.result is not None and not done.result.ok


class Progress:
    """The status line: drawn with ``\\r`` on a terminal, silent otherwise."""

    def __init__(
        self,
        total: int,
        already: int,
        stream: TextIO,
        *,
        enabled: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.done = already
        self.running = 0
        self.ran = 0
        self.failed = 0
        self.errors = 0
        self.cleanup_errors = 0
        self.lost = 0
        """Cluster attempts lost with their node and retried (not done)."""
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self._clock = clock
        self._began = clock()

    def start(self, job_id: JobId) -> None:
        """A job was admitted by the batch (it may still wait for the host's capacity)."""
        self.running += 1

    def record(self, done: JobResult) -> None:
        if done.lost:  # the job goes on with another attempt
            self.lost += 1
            self.running = max(self.running - 1, 0)
            self.draw()
            return
        self.done += 1
        self.ran += 1
        self.running = max(self.running - 1, 0)
        if done.error is not None:
            self.errors += 1
            if done.error.type == CleanupError.__name__:
                self.cleanup_errors += 1
        elif is_failure(done):
            self.failed += 1
        self.draw()

    @property
    def elapsed_s(self) -> float:
        return self._clock() - self._began

    def line(self) -> str:
        return format_progress(
            done=self.done,
            total=self.total,
            failed=self.failed,
            errors=self.errors,
            ran=self.ran,
            elapsed_s=self.elapsed_s,
            running=self.running,
            width=shutil.get_terminal_size().columns - 1 if self.enabled else None,
        )

    def draw(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line() + "\x1b[K")
            self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.draw()
            self.stream.write("\n")
            self.stream.flush()
