"""Suite-wide setup: a private supervisor state directory for this test session.

Runs go through the auto-launched supervisor by default; giving the session its own state dir
keeps its leases apart from a developer's ~/.sbxkit and from other sessions.
"""

from __future__ import annotations

import os
import secrets
import tempfile

from tests import speed

_STATE_ROOT = tempfile.mkdtemp(prefix="sbxkit-tests-")
os.environ.setdefault("SBXKIT_STATE_DIR", os.path.join(_STATE_ROOT, "leases"))

# Every container this test session creates carries its own run label (Settings.labels from
# SBXKIT_LABELS), so the witness can tell another session's containers on a shared daemon from
# its own and never counts or removes them.
RUN_LABEL = "sbxkit-test.run"
os.environ.setdefault("SBXKIT_LABELS", f"{RUN_LABEL}={secrets.token_hex(8)}")


def pytest_report_header() -> str:
    """The machine's slowness, measured once per session before any test (tests/speed.py):
    timing bounds that a slower machine exceeds are multiplied by it, each up to its ceiling."""
    slowness, best = speed.measured()
    return (
        f"sbxkit: timing bounds x{slowness:.2f} (a CPU loop took {best * 1000:.0f} ms of CPU, "
        f"the CI machine's {speed.REFERENCE_LOOP_S * 1000:.0f} ms)"
    )
