"""How many sandboxes each client, and all of them together, may have at once (pure).

A slot is held by every open sandbox (``sandbox_open`` until it ends) and every run under way
(``run`` until its sandbox is removed): both are containers the operator pays for. A call that
finds no slot is refused at once — nothing is created, nothing waits — naming the bound and
how to free a slot.
"""

from __future__ import annotations

from collections import Counter

from sbxkit.errors import QuotaExhausted


class Quotas:
    """Slots per client and in all; ``take`` refuses, ``give`` returns one."""

    def __init__(self, per_client: int, in_all: int) -> None:
        self.per_client = per_client
        self.in_all = in_all
        self._held: Counter[str] = Counter()

    def held(self, client: str | None = None) -> int:
        return self._held.total() if client is None else self._held[client]

    def take(self, client: str) -> None:
        if self._held[client] >= self.per_client:
            raise QuotaExhausted(
                "mcp.max_sandboxes_per_client",
                f"this client already has {self._held[client]} sandboxes open or running (the "
                f"operator allows {self.per_client}); close one with sandbox_close first",
            )
        if self._held.total() >= self.in_all:
            raise QuotaExhausted(
                "mcp.max_sandboxes",
                f"the server already holds {self._held.total()} sandboxes for all its clients "
                f"(the operator allows {self.in_all}); try again when one has ended",
            )
        self._held[client] += 1

    def give(self, client: str) -> None:
        if self._held[client] <= 0:
            raise AssertionError(f"no slot held by {client!r}")
        self._held[client] -= 1
        if not self._held[client]:
            del self._held[client]
