"""What the asyncio and blocking facades (``sbxkit.aio``, ``sbxkit.blocking``) share: a
sandbox, interpreter or background process held in a portal's trio thread, and what can be
read of it without a call into that thread."""

from __future__ import annotations

from sbxkit._consumers.interpreter import Interpreter
from sbxkit._consumers.process_log import ProcessExit
from sbxkit._consumers.processes import Process
from sbxkit._consumers.session import Sandbox
from sbxkit._util.portal import Portal


class HeldSandbox:
    """A ``Sandbox`` whose calls go through ``portal``."""

    def __init__(self, portal: Portal, sandbox: Sandbox) -> None:
        self._portal = portal
        self._sandbox = sandbox

    @property
    def container_id(self) -> str:
        return self._sandbox.container_id

    @property
    def lease(self) -> str:
        return self._sandbox.lease


class HeldProcess:
    """A background ``Process`` whose calls go through ``portal``."""

    def __init__(self, portal: Portal, process: Process) -> None:
        self._portal = portal
        self._process = process

    @property
    def id(self) -> str:
        return self._process.id

    @property
    def exit(self) -> ProcessExit | None:
        """How it ended, or None while it runs."""
        return self._process.exit


class HeldInterpreter:
    """An ``Interpreter`` whose calls go through ``portal``."""

    def __init__(self, portal: Portal, interpreter: Interpreter) -> None:
        self._portal = portal
        self._interpreter = interpreter

    @property
    def python_version(self) -> str | None:
        return self._interpreter.python_version

    @property
    def container_id(self) -> str:
        return self._interpreter.sandbox.container_id
