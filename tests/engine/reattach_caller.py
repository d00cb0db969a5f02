"""A process on either side of a detached session (tests/engine/test_reattach.py).

    python reattach_caller.py open STATE_DIR IMAGE KEEP_S   opens a session, writes
        /tmp/note.txt, detaches it for KEEP_S seconds, prints the handle's JSON and exits;
    python reattach_caller.py attach < HANDLE_JSON   reattaches, runs ``cat /tmp/note.txt``,
        prints one JSON line (``stdout``, ``exit_code``, ``lease``, ``attach_s``), ends the block;
    python reattach_caller.py hold < HANDLE_JSON   reattaches, prints ``attached LEASE`` and
        sleeps until killed.

A refused reattach prints ``refused: …`` and exits 3; any other sbxkit error exits 70.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import trio

from sbxkit._consumers.handle import SandboxHandle
from sbxkit._consumers.reattach import attach_sandbox
from sbxkit._consumers.session import open_sandbox
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit.engine.client import open_engine
from sbxkit.errors import ReattachRefused, SbxError
from tests.engine.helpers import spec
from tests.witness import SOCKET


async def open_and_detach(state_dir: Path, image: str, keep_s: float) -> int:
    async with open_engine(SOCKET) as engine:
        owner = SupervisedOwner(engine, state_dir=state_dir)
        async with open_sandbox(
            spec(image, "true", timeout_s=120), engine=engine, owner=owner
        ) as box:
            await box.put_files({"note.txt": b"written by the first process"})
            handle = await box.detach(keep_s)
    sys.stdout.buffer.write(handle.to_json() + b"\n")
    return 0


async def attach(hold: bool) -> int:
    handle = SandboxHandle.from_json(sys.stdin.buffer.read())
    began = time.perf_counter()
    async with attach_sandbox(handle) as box:
        attach_s = time.perf_counter() - began
        if hold:
            print("attached", box.lease, flush=True)
            await trio.sleep_forever()
        result = await box.exec(["cat", "/tmp/note.txt"])
        line = {
            "stdout": result.stdout.decode(errors="replace"),
            "exit_code": result.exit_code,
            "lease": box.lease,
            "attach_s": attach_s,
        }
    print(json.dumps(line), flush=True)
    return 0


async def main(argv: list[str]) -> int:
    try:
        if argv[0] == "open":
            return await open_and_detach(Path(argv[1]), argv[2], float(argv[3]))
        return await attach(hold=argv[0] == "hold")
    except ReattachRefused as exc:
        print(f"refused: {exc.reason}", flush=True)
        return 3
    except SbxError as exc:
        print(f"error: {exc}", flush=True)
        return 70


if __name__ == "__main__":
    sys.exit(trio.run(main, sys.argv[1:]))
