"""The Ray resources an sbxkit node advertises and a job asks for (pure).

A node that runs sandboxes declares, when its raylet starts, what its supervisor admits:
``sbxkit_sandboxes`` (live sandboxes, the supervisor's ``--max-workers``) and
``sbxkit_memory_mib`` (its memory budget). ``sbxkit cluster resources`` prints that JSON for
``ray start --resources``. Each job's relay task asks for one sandbox and its memory limit, so
Ray places it on a node whose supervisor will admit it now; the supervisor still admits it
itself (docs/cluster.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from sbxkit._consumers.harness import Need
from sbxkit._lifecycle.admission import default_memory_budget

SANDBOXES = "sbxkit_sandboxes"
MEMORY_MIB = "sbxkit_memory_mib"
MiB = 1024 * 1024


def job_resources(need: Need) -> dict[str, float]:
    """What one job's relay task holds while it runs: a sandbox and its memory, in whole MiB
    (Ray takes custom amounts above 1 only as whole numbers)."""
    return {SANDBOXES: 1, MEMORY_MIB: max(1, math.ceil(need.memory_bytes / MiB))}


def node_resources(
    *, max_workers: int, mem_total: int, memory_budget_bytes: int | None = None
) -> dict[str, int]:
    """What a node advertises: its supervisor's live-sandbox cap and memory budget (by default
    the daemon's ``MemTotal`` less the supervisor's headroom, as the supervisor computes it)."""
    budget = (
        memory_budget_bytes if memory_budget_bytes is not None else default_memory_budget(mem_total)
    )
    return {SANDBOXES: max_workers, MEMORY_MIB: budget // MiB}


def declared(resources: Mapping[str, float]) -> dict[str, float] | None:
    """A node's sbxkit resources, or None for a node that declares none (not a sandbox node)."""
    found = {key: float(resources[key]) for key in (SANDBOXES, MEMORY_MIB) if key in resources}
    return found or None


def declaration_problem(resources: Mapping[str, float]) -> str | None:
    """Why a node's sbxkit declaration cannot serve any job, or None."""
    missing = [key for key in (SANDBOXES, MEMORY_MIB) if resources.get(key, 0) < 1]
    if missing:
        return (
            f"declares {', '.join(f'{k}={resources.get(k, 0):g}' for k in missing)}; a sandbox "
            f"node needs {SANDBOXES} and {MEMORY_MIB} >= 1 (ray start --resources "
            '"$(sbxkit cluster resources)")'
        )
    return None


def fits(asked: Mapping[str, float], total: Mapping[str, float]) -> bool:
    """Whether a job's resources fit a node's whole declaration (an idle node)."""
    return all(total.get(key, 0) >= amount for key, amount in asked.items())
