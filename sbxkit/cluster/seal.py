"""Sealing what crosses Ray for sbxkit with keys only the cluster secret's holders have (pure).

Ray's token decides who may join the Ray cluster; it says nothing about which node is an sbxkit
node, and whatever a task returns is whatever its node's code made. So every message between
the driver and a node's agent is sealed (AES-GCM, an authenticated cipher) under a key derived
from the cluster secret (``secret.py``) and the batch's id, a random value the driver picks
for each batch:

- a join report, bound to the driver's per-join challenge and the node's Ray id;
- a job (its spec, stdin and environment: unreadable to any node without the secret), bound to
  its index and attempt;
- an outcome, bound to the same index and attempt.

A message sealed for another batch, purpose, node, job or attempt, or by anyone without the
secret, does not open (``Forged``): a rogue node can neither pass the join check, nor read a
job Ray placed on it, nor return a result for one.
"""

from __future__ import annotations

import hashlib
import hmac
import os

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

PURPOSES = ("report", "job", "outcome")
NONCE_BYTES = 12
BATCH_ID_BYTES = 16
LABEL = b"sbxkit cluster v1\0"


class Forged(Exception):
    """A sealed message that does not open: not sealed by a holder of this batch's keys for
    this purpose and context (or altered on the way)."""


def new_batch_id() -> bytes:
    return os.urandom(BATCH_ID_BYTES)


def context(*parts: str | int | bytes) -> bytes:
    """What a message is bound to, encoded without ambiguity (msgpack of the parts)."""
    return msgspec.msgpack.encode(parts)


class Keys:
    """One batch's keys: one per purpose, derived from the cluster secret and the batch id."""

    def __init__(self, secret: bytes, batch_id: bytes) -> None:
        if len(batch_id) != BATCH_ID_BYTES:
            raise ValueError(f"a batch id has {BATCH_ID_BYTES} bytes, got {len(batch_id)}")
        self.batch_id = batch_id
        self._ciphers = {
            purpose: AESGCM(
                hmac.new(
                    secret, LABEL + purpose.encode() + b"\0" + batch_id, hashlib.sha256
                ).digest()
            )
            for purpose in PURPOSES
        }

    def seal(self, purpose: str, bound_to: bytes, message: bytes) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._ciphers[purpose].encrypt(nonce, message, bound_to)

    def open(self, purpose: str, bound_to: bytes, sealed: bytes) -> bytes:
        """The message, or ``Forged``."""
        if not isinstance(sealed, bytes) or len(sealed) < NONCE_BYTES + 16:
            raise Forged("not a sealed message")
        try:
            return self._ciphers[purpose].decrypt(
                sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], bound_to
            )
        except InvalidTag:
            raise Forged("does not verify against this batch's cluster keys") from None
