"""Whether the Ray cluster enforces token authentication — asked of the cluster, not assumed.

A Ray cluster started without ``RAY_AUTH_MODE=token`` lets anyone who reaches its GCS port join
as a node or a driver and run code on every node as the node's user (root, on a Docker host:
the engine and every sandbox are then theirs). The driver's own ``RAY_AUTH_MODE`` says nothing
about that: a client that sends a token is let in by a cluster that checks none. So before a
batch sends anything, the driver asks the cluster's GCS the way an outsider would: a separate
process with token authentication off and no token (``PROBE``) calls it, and only a refusal
for authentication counts as "enforced". Ray's own client does the calling (``GcsClient``), so
this holds for whatever the GCS checks, not for what sbxkit assumes it checks.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

import trio

PROBE_TIMEOUT_S = 60.0
AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")

PROBE = """
import json, sys
try:
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError
except ImportError as exc:
    print(json.dumps({"error": f"cannot import Ray's client: {exc}"})); sys.exit(0)
try:
    client = GcsClient(address=sys.argv[1])
    client.internal_kv_get(b"sbxkit-auth-probe", None, timeout=10)
except AuthenticationError as exc:
    print(json.dumps({"enforced": True, "said": str(exc).splitlines()[0][:200]}))
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}))
else:
    print(json.dumps({"enforced": False}))
"""
"""Run as ``python -I -c PROBE GCS_ADDRESS`` with authentication off: prints one JSON verdict."""

HOW_TO = (
    "start every node of the cluster (head and workers) with RAY_AUTH_MODE=token and the "
    "cluster's token (RAY_AUTH_TOKEN_PATH=FILE, RAY_AUTH_TOKEN, or ~/.ray/auth_token; "
    "`ray get-auth-token --generate` makes one), and run the driver with the same; "
    "docs/cluster.md"
)


def probe_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The probe's environment: this process's, with token authentication off and no token."""
    clean = {k: v for k, v in environ.items() if k not in AUTH_VARIABLES}
    clean["RAY_AUTH_MODE"] = "disabled"
    return clean


def verdict(returncode: int, stdout: str) -> bool | str:
    """True: the cluster refused the unauthenticated call; False: it answered it; a string:
    why the probe could not tell."""
    lines = stdout.strip().splitlines()
    try:
        said = json.loads(lines[-1]) if lines else None
    except ValueError:
        said = None
    if not isinstance(said, dict):
        return f"the probe exited {returncode} without a verdict"
    if said.get("enforced") is True:
        return True
    if said.get("enforced") is False:
        return False
    return str(said.get("error", "no verdict"))


async def cluster_enforces_token_auth(gcs_address: str) -> bool | str:
    """Ask the cluster at ``gcs_address`` (``verdict``'s answer)."""
    with trio.move_on_after(PROBE_TIMEOUT_S):
        done = await trio.run_process(
            [sys.executable, "-I", "-c", PROBE, gcs_address],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=probe_environment(os.environ),
            cwd="/",
        )
        return verdict(done.returncode, done.stdout.decode(errors="replace"))
    return f"the probe did not answer within {PROBE_TIMEOUT_S:g} s"
