"""A caller process for the re-adoption tests: one supervised run of ``sh -c SCRIPT``.

    python readoption_caller.py STATE_DIR IMAGE SCRIPT

Prints ``running LEASE`` once the payload's first output arrived, then the result as one JSON
line (``status``, ``exit_code``, ``stdout``, ``stderr``, ``lease``) — or ``error: …`` and exit
74 for a ``CleanupError``, 70 for any other sbxkit error. A test SIGKILLs it at will.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from sbxkit._consumers.runner import run
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.result import Stream
from sbxkit.engine.client import open_engine
from sbxkit.errors import CleanupError, SbxError
from tests.engine.helpers import spec
from tests.witness import SOCKET


async def main(state_dir: Path, image: str, script: str) -> int:
    async with open_engine(SOCKET) as engine:
        owner = SupervisedOwner(engine, state_dir=state_dir)
        told = False

        def on_output(stream: Stream, chunk: bytes) -> None:
            nonlocal told
            if not told:
                told = True
                print("running", owner_lease(owner), flush=True)

        try:
            result = await run(
                spec(image, script, timeout_s=60), engine=engine, owner=owner, on_output=on_output
            )
        except CleanupError as exc:
            print(f"error: {exc}", flush=True)
            return 74
        except SbxError as exc:
            print(f"error: {exc}", flush=True)
            return 70
    line = {
        "status": result.status,
        "exit_code": result.exit_code,
        "stdout": result.stdout.decode(errors="replace"),
        "stderr": result.stderr.decode(errors="replace"),
        "lease": result.lease,
    }
    print(json.dumps(line), flush=True)
    return 0


def owner_lease(owner: SupervisedOwner) -> str:
    (lease,) = owner._links
    return lease


if __name__ == "__main__":
    sys.exit(trio.run(main, Path(sys.argv[1]), sys.argv[2], sys.argv[3]))
