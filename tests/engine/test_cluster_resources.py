"""``sbxkit cluster resources`` against a real engine: the supervisor's default budget, from the
daemon's ``MemTotal`` (the JSON a node gives ``ray start --resources``; docs/cluster.md)."""

from __future__ import annotations

import json
import subprocess
import sys

from sbxkit._lifecycle.admission import default_memory_budget
from tests.witness import Witness


def test_a_node_advertises_its_supervisors_default_budget(witness: Witness) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sbxkit", "cluster", "resources", "--socket", witness.socket_path],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    mem_total = witness.get("/info")["MemTotal"]
    assert json.loads(out.stdout) == {
        "sbxkit_memory_mib": default_memory_budget(mem_total) // (1024 * 1024),
        "sbxkit_sandboxes": 64,
    }
