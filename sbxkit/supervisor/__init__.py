"""The supervisor process: the server that admits, journals, creates and removes every lease's
container and recovers after a crash (docs/operations.md). Its client side — how a caller
reaches it, registers and re-adopts a lease — is ``sbxkit._lifecycle`` (``supervised``,
``connect``, ``link``, ``launch``); what both sides share is ``sbxkit._protocol``; its side of the
hand-off is ``sbxkit.supervisor.handoff``."""
