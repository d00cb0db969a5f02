"""A caller process of the re-adoption chaos test: supervised runs, one after another.

    python chaos_caller.py PLAN_JSON

``PLAN_JSON``: ``{"state_dir": DIR, "image": IMAGE, "runs": [{"id": ID, "script": SH}, ...]}``.
Prints one JSON line per run as it ends: ``id``, ``status``, ``exit_code``, ``stdout``,
``lease`` — or ``id`` and ``error`` (``cleanup``: it was a ``CleanupError``, exit 74's). The
test SIGKILLs it at random; what it printed before stands.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import trio

from sbxkit._consumers.runner import run
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit.engine.client import open_engine
from sbxkit.errors import CleanupError, SbxError
from tests.engine.helpers import spec
from tests.witness import SOCKET


async def main(plan: dict[str, Any]) -> None:
    async with open_engine(SOCKET) as engine:
        owner = SupervisedOwner(engine, state_dir=Path(plan["state_dir"]))
        for item in plan["runs"]:
            line: dict[str, Any] = {"id": item["id"]}
            try:
                sandbox = spec(plan["image"], item["script"], timeout_s=60)
                result = await run(sandbox, engine=engine, owner=owner)
            except SbxError as exc:
                line.update(error=str(exc), cleanup=isinstance(exc, CleanupError))
            else:
                line.update(
                    status=result.status,
                    exit_code=result.exit_code,
                    stdout=result.stdout.decode(errors="replace"),
                    lease=result.lease,
                )
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    trio.run(main, json.loads(sys.argv[1]))
