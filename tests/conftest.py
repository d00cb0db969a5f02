"""Suite-wide setup: a private supervisor state directory for this test session.

Runs go through the auto-launched supervisor by default; giving the session its own state dir
keeps its leases apart from a developer's ~/.sbxkit and from other sessions.
"""

from __future__ import annotations

import os
import secrets
import tempfile

_STATE_ROOT = tempfile.mkdtemp(prefix="sbxkit-tests-")
os.environ.setdefault("SBXKIT_STATE_DIR", os.path.join(_STATE_ROOT, "leases"))

# Every container this test session creates carries its own run label (Settings.labels from
# SBXKIT_LABELS), so the witness can tell another session's containers on a shared daemon from
# its own and never counts or removes them.
RUN_LABEL = "sbxkit-test.run"
os.environ.setdefault("SBXKIT_LABELS", f"{RUN_LABEL}={secrets.token_hex(8)}")
