"""The implementation fingerprint exchanged in the supervisor handshake."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

# The sources that define supervision behaviour: a helper built from other revisions of these
# is refused, so an upgrade cannot silently mix two lease protocols.
SOURCES = (
    "supervisor/wire.py",
    "supervisor/channel.py",
    "supervisor/records.py",
    "supervisor/journal.py",
    "supervisor/service.py",
    "supervisor/client.py",
    "supervisor/link.py",  # the client's side of re-adoption (issue 22)
    "supervisor/proof.py",
    "engine/models.py",
    "network/terms.py",  # NetworkTerms and Denial travel in Register and Denials
    "network/audit.py",
)


@functools.cache
def implementation_fingerprint() -> str:
    """sha256 (truncated to 128 bits) over ``SOURCES``; the same tree gives the same value."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for relative in SOURCES:
        digest.update(relative.encode() + b"\0")
        digest.update((root / relative).read_bytes())
    return digest.hexdigest()[:32]
