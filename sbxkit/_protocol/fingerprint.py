"""What the supervisor handshake exchanges: the protocol version and the implementation
fingerprint (standard library only: ``sbxkit run``'s hand-off sends them from a process that
loads nothing else)."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is not loaded here
if TYPE_CHECKING:
    from hashlib import sha256
else:
    try:  # the built-in sha256: no OpenSSL to load in a process that lives for one run
        from _sha256 import sha256
    except ImportError:  # pragma: no cover - built elsewhere (3.12: _sha2)
        from hashlib import sha256

__all__ = ["PROTOCOL_VERSION", "SOURCES", "implementation_fingerprint"]

PROTOCOL_VERSION = 11
"""Bumped with every change to the messages (``wire.py``) or their meaning."""

# The sources that define supervision behaviour: a helper built from other revisions of these
# is refused, so an upgrade cannot silently mix two lease protocols.
SOURCES = (
    "_protocol/wire.py",
    "_protocol/framing.py",
    "_protocol/handoff_wire.py",
    "_protocol/channel.py",
    "_protocol/records.py",
    "_protocol/journal.py",
    "supervisor/service.py",
    "_lifecycle/supervised.py",
    "_lifecycle/connect.py",
    "_lifecycle/link.py",  # the client's side of re-adoption (issue 22)
    "_protocol/proof.py",
    "engine/models.py",
    "_model/network_terms.py",  # NetworkTerms and Denial travel in Register and Denials
    "_model/network_audit.py",
    "_model/network_inject.py",  # InjectTerms travel in Register (network.inject)
    "handoff/client.py",  # the command line's side of Run, RunStarted, RunEnded ...
    "supervisor/handoff/serve.py",
    "supervisor/handoff/resume.py",  # RunResume: the supervisor's side
    "handoff/rejoin.py",  # RunResume: the command line's side
)


_COMPUTED: list[str] = []


def implementation_fingerprint() -> str:
    """sha256 (truncated to 128 bits) over ``SOURCES``; the same tree gives the same value
    (computed once per process)."""
    if _COMPUTED:
        return _COMPUTED[0]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = sha256()
    for relative in SOURCES:
        digest.update(relative.encode() + b"\0")
        with open(os.path.join(root, relative), "rb") as source:
            digest.update(source.read())
    _COMPUTED.append(digest.hexdigest()[:32])
    return _COMPUTED[0]
