"""A supervisor whose hand-off preload is held half-way through the run's grammar (a test's
fault injection, tests/engine/test_handoff.py).

    python paused_preload_supervisor.py SUPERVISOR_ARGS...

Runs ``sbxkit.supervisor`` as ever, except that an import of ``sbxkit._grammar.run_grammar``
from a worker thread (the preload, ``_load_handoff``) first waits — up to ``PAUSE_S`` — for the
event loop's thread to start importing the hand-off itself
(``sbxkit.supervisor.handoff.resume``). The package is then half loaded
(``sbxkit._grammar.common`` in, ``sbxkit._grammar.run_grammar`` not): the interleaving a loaded
CI machine produced by chance, made certain. It prints ``preload paused`` when it holds the
preload and ``preload resumed: …`` when it lets it go, for the test to wait on and check.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

PAUSE_S = 3.0


class PausedPreload:
    """A meta path finder that finds nothing: it only holds the preload at one import."""

    def __init__(self) -> None:
        self.loop_imports = threading.Event()

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if threading.current_thread() is threading.main_thread():
            if name == "sbxkit.supervisor.handoff.resume":
                self.loop_imports.set()
        elif name == "sbxkit._grammar.run_grammar":
            print("preload paused", flush=True)
            joined = self.loop_imports.wait(PAUSE_S)
            whom = "the event loop imports the hand-off too" if joined else "alone"
            print(f"preload resumed: {whom}", flush=True)
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, PausedPreload())
    from sbxkit.supervisor.service import main

    main(sys.argv[1:])
