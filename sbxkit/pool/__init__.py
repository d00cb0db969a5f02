"""Pre-started single-use sandboxes (docs/pool.md), one package:

- ``line``: the claim line — how a run's command and env reach a parked shell (pure);
- ``shape``: a pooled container's shape and the spec it is parked from (pure);
- ``sizing``: how many a batch parks per shape (pure);
- ``inprocess``: ``open_pool`` / ``Pool`` / ``Claim`` / ``PoolBatch``, a pool held by this
  process;
- ``held``: ``PooledBackend`` / ``HeldPool``, claims from the pools the supervisor holds;
- ``shapes``: ``PoolPerShape``, a batch's pool per shape.

Names load on first use (PEP 562). The one claim mechanism, shared with the supervisor's pools,
is ``sbxkit._util.parking`` (``ParkingBudget``, re-exported here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sbxkit._util.lazy import lazy_names

if TYPE_CHECKING:
    from sbxkit._util.parking import ParkingBudget
    from sbxkit.errors import PoolUnavailable
    from sbxkit.pool.held import HeldPool, PooledBackend
    from sbxkit.pool.inprocess import Claim, Pool, PoolBatch, open_pool
    from sbxkit.pool.line import PARK_SCRIPT, claim_line, claim_line_within
    from sbxkit.pool.shape import parked_spec, shape_of
    from sbxkit.pool.shapes import PoolPerShape

_WHERE = {
    "HeldPool": "sbxkit.pool.held",
    "PooledBackend": "sbxkit.pool.held",
    "PoolUnavailable": "sbxkit.errors",
    "Claim": "sbxkit.pool.inprocess",
    "Pool": "sbxkit.pool.inprocess",
    "PoolBatch": "sbxkit.pool.inprocess",
    "open_pool": "sbxkit.pool.inprocess",
    "PARK_SCRIPT": "sbxkit.pool.line",
    "claim_line": "sbxkit.pool.line",
    "claim_line_within": "sbxkit.pool.line",
    "ParkingBudget": "sbxkit._util.parking",
    "parked_spec": "sbxkit.pool.shape",
    "shape_of": "sbxkit.pool.shape",
    "PoolPerShape": "sbxkit.pool.shapes",
}

__all__ = [
    "PARK_SCRIPT",
    "Claim",
    "HeldPool",
    "ParkingBudget",
    "Pool",
    "PoolBatch",
    "PoolPerShape",
    "PoolUnavailable",
    "PooledBackend",
    "claim_line",
    "claim_line_within",
    "open_pool",
    "parked_spec",
    "shape_of",
]


__getattr__ = lazy_names(__name__, _WHERE, globals())
