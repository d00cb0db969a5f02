"""Pre-started single-use sandboxes (docs/pool.md), one package:

- ``line``: the claim line — how a run's command and env reach a parked shell (pure);
- ``shape``: a pooled container's shape and the spec it is parked from (pure);
- ``sizing``: how many a batch parks per shape (pure);
- ``inprocess``: ``open_pool`` / ``Pool`` / ``Claim``, a pool held by this process;
- ``held``: ``PooledBackend`` / ``HeldPool``, claims from the pools the supervisor holds;
- ``shapes``: ``PoolPerShape``, a batch's pool per shape.

Names load on first use (PEP 562). The one claim mechanism, shared with the supervisor's pools,
is ``sbxkit._util.parking`` (``ParkingBudget``, re-exported here).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sbxkit._util.parking import ParkingBudget
    from sbxkit.errors import PoolUnavailable
    from sbxkit.pool.held import HeldPool, PooledBackend
    from sbxkit.pool.inprocess import Claim, Pool, open_pool
    from sbxkit.pool.line import PARK_SCRIPT, claim_line, claim_line_within
    from sbxkit.pool.shape import parked_spec, shape_of
    from sbxkit.pool.shapes import PoolPerShape

_WHERE = {
    "HeldPool": "held",
    "PooledBackend": "held",
    "PoolUnavailable": "held",
    "Claim": "inprocess",
    "Pool": "inprocess",
    "open_pool": "inprocess",
    "PARK_SCRIPT": "line",
    "claim_line": "line",
    "claim_line_within": "line",
    "ParkingBudget": "parking",
    "parked_spec": "shape",
    "shape_of": "shape",
    "PoolPerShape": "shapes",
}

__all__ = [
    "PARK_SCRIPT",
    "Claim",
    "HeldPool",
    "ParkingBudget",
    "Pool",
    "PoolPerShape",
    "PoolUnavailable",
    "PooledBackend",
    "claim_line",
    "claim_line_within",
    "open_pool",
    "parked_spec",
    "shape_of",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'sbxkit.pool' has no attribute {name!r}")
    where = _WHERE[name]
    module = "sbxkit._util.parking" if where == "parking" else f"sbxkit.pool.{where}"
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
