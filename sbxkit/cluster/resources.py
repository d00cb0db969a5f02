"""The Ray resources an sbxkit node advertises and a job asks for (pure).

A node that runs sandboxes declares, when its raylet starts, what its supervisor admits:
``sbxkit_sandboxes`` (live sandboxes, the supervisor's ``--max-workers``) and
``sbxkit_memory_mib`` (its memory budget). ``sbxkit cluster resources`` prints that JSON for
``ray start --resources``. Each job's relay task asks for one sandbox and its memory limit, so
Ray places it on a node whose supervisor will admit it now; the supervisor still admits it
itself (docs/cluster.md).

A relay also holds one of the node's Ray CPUs (``RELAY_CPUS``) while its job runs: each running
relay is one Ray worker process, and without a CPU to hold Ray starts a worker for every relay
its custom resources admit (28 on a 2-core node at ``--parallel 64``), each costing a Python
start. So a node runs at most ``min(sbxkit_sandboxes, CPU)`` jobs at once (``node_slots``);
the rest wait in Ray.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from sbxkit._consumers.harness import Need
from sbxkit._lifecycle.admission import default_memory_budget

SANDBOXES = "sbxkit_sandboxes"
MEMORY_MIB = "sbxkit_memory_mib"
CPU = "CPU"
RELAY_CPUS = 1
"""The Ray CPUs a relay holds while its job runs (it waits without releasing them)."""
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
    """A node's sbxkit resources and its Ray CPUs, or None for a node that declares no sbxkit
    resources (not a sandbox node)."""
    found = {key: float(resources[key]) for key in (SANDBOXES, MEMORY_MIB) if key in resources}
    if not found:
        return None
    return {**found, CPU: float(resources.get(CPU, 0))}


def node_slots(resources: Mapping[str, float]) -> int:
    """How many of the batch's jobs a node runs at once: a sandbox and a relay's CPU each."""
    return int(min(resources.get(SANDBOXES, 0), resources.get(CPU, 0) // RELAY_CPUS))


def declaration_problem(resources: Mapping[str, float]) -> str | None:
    """Why a node's sbxkit declaration cannot serve any job, or None."""
    missing = [key for key in (SANDBOXES, MEMORY_MIB) if resources.get(key, 0) < 1]
    if missing:
        return (
            f"declares {', '.join(f'{k}={resources.get(k, 0):g}' for k in missing)}; a sandbox "
            f"node needs {SANDBOXES} and {MEMORY_MIB} >= 1 (ray start --resources "
            '"$(sbxkit cluster resources)")'
        )
    if resources.get(CPU, 0) < RELAY_CPUS:
        return (
            f"declares {CPU}={resources.get(CPU, 0):g}; each running job's relay holds "
            f"{RELAY_CPUS} (one Ray worker process): ray start --num-cpus N"
        )
    return None


def fits(asked: Mapping[str, float], total: Mapping[str, float]) -> bool:
    """Whether a job's resources fit a node's whole declaration (an idle node)."""
    return all(total.get(key, 0) >= amount for key, amount in asked.items())
