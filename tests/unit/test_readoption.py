"""Re-adoption's pure parts (issue 22): the ownership proof, the record's rotation, the flag.

No supervisor, no daemon: ``check_proof`` against records, ``rotated`` records round-tripping
through the journal's encoding, ``--adopt-grace`` parsing. The engine tests are in
tests/engine/test_readoption.py.
"""

from __future__ import annotations

import itertools
import secrets

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbxkit._protocol import records as rec
from sbxkit._protocol.proof import MAX_SPENT, check_proof, refusal_reason, rotated, secret_hash
from sbxkit._protocol.records import LeaseRecord, decode_record, encode_record
from sbxkit.supervisor.config import ADOPT_GRACE_S, build_parser, config_from_args

LEASE = "a" * 32


def new_secret() -> str:
    return secrets.token_hex(32)


def record(secret: str | None, **fields: object) -> LeaseRecord:
    base = LeaseRecord(
        lease=LEASE,
        name=f"sbxkit-{LEASE}",
        state="created",
        container_id="c" * 64,
        engine_socket="/run/docker.sock",
        registered_at=1.0,
        lifetime_deadline=100.0,
        memory_bytes=1 << 28,
        nano_cpus=10**9,
        secret_hash=None if secret is None else secret_hash(secret),
    )
    return msgspec.structs.replace(base, **fields)


def test_the_current_secret_proves_the_lease_and_rotation_spends_it() -> None:
    first, second, third = new_secret(), new_secret(), new_secret()
    held = record(first)
    assert check_proof(held, first, secret_hash(second)) == "accepted"
    after = rotated(held, first, secret_hash(second))
    assert after.secret_hash == secret_hash(second)
    assert after.spent_hashes == (secret_hash(first),)
    # The next adoption needs the next secret; the first is spent.
    assert check_proof(after, second, secret_hash(third)) == "accepted"
    assert check_proof(after, first, secret_hash(third)) == "replayed"


def test_a_retry_of_an_unanswered_adoption_is_accepted_only_with_the_same_next_hash() -> None:
    """The supervisor died after journaling the rotation, before answering: the caller sends
    the same pair again. Only that exact pair is a retry; a spent secret with any other next
    hash is a replay."""
    first, second = new_secret(), new_secret()
    after = rotated(record(first), first, secret_hash(second))
    assert check_proof(after, first, secret_hash(second)) == "retried"
    assert check_proof(after, first, secret_hash(new_secret())) == "replayed"


def test_wrong_unadoptable_and_malformed_proofs_are_refused() -> None:
    first = new_secret()
    assert check_proof(record(first), new_secret(), secret_hash(new_secret())) == "wrong"
    assert check_proof(record(None), first, secret_hash(new_secret())) == "unadoptable"
    for secret, next_hash in [
        ("", secret_hash(first)),
        (first.upper(), secret_hash(first)),
        (first, "x" * 64),
        (first + "0", secret_hash(new_secret())),
        (first, secret_hash(first)),  # the next hash must differ from the current one
    ]:
        assert check_proof(record(first), secret, next_hash) == "malformed", (secret, next_hash)
    assert "replayed" in refusal_reason("replayed")
    assert "wrong" in refusal_reason("wrong")


def test_spent_hashes_are_bounded_newest_last() -> None:
    secrets_ = [new_secret() for _ in range(MAX_SPENT + 3)]
    held = record(secrets_[0])
    for used, following in itertools.pairwise(secrets_):
        held = rotated(held, used, secret_hash(following))
    assert len(held.spent_hashes) == MAX_SPENT
    assert held.spent_hashes[-1] == secret_hash(secrets_[-2])
    assert held.secret_hash == secret_hash(secrets_[-1])


@given(st.binary(min_size=32, max_size=32), st.binary(min_size=32, max_size=32))
def test_only_the_secret_itself_proves_ownership(secret: bytes, other: bytes) -> None:
    """The journal's hash is no proof: offering it (or anything but the secret) fails."""
    owned = secret.hex()
    held = record(owned)
    next_hash = secret_hash(new_secret())
    assert held.secret_hash is not None
    assert check_proof(held, held.secret_hash, next_hash) != "accepted"
    if other != secret:
        assert check_proof(held, other.hex(), next_hash) == "wrong"


def test_records_with_the_new_fields_round_trip_and_old_records_still_read() -> None:
    first, second = new_secret(), new_secret()
    held = rotated(record(first, governed=True), first, secret_hash(second))
    assert decode_record("p", encode_record(held)) == held
    legacy = msgspec.json.encode(
        {k: v for k, v in msgspec.structs.asdict(record(None)).items() if v is not None}
    )
    old = msgspec.json.decode(legacy)
    for key in ("secret_hash", "spent_hashes", "governed"):
        old.pop(key, None)
    decoded = decode_record("p", msgspec.json.encode(old))
    assert decoded.secret_hash is None
    assert decoded.spent_hashes == ()
    assert not decoded.governed


def test_an_uncertain_record_keeps_its_hash_only_when_its_caller_may_come_back() -> None:
    first = new_secret()
    creating = record(first, state="creating", container_id=None)
    assert rec.uncertain(creating, "restarted").secret_hash == secret_hash(first)
    assert rec.uncertain(creating, "create failed", adoptable=False).secret_hash is None
    adopted = rec.adopted_create(rec.uncertain(creating, "restarted"), "d" * 64)
    assert (adopted.state, adopted.container_id, adopted.reason) == ("created", "d" * 64, None)
    with pytest.raises(ValueError, match="already created"):
        rec.adopted_create(adopted, "e" * 64)


def test_adopt_grace_defaults_and_accepts_zero_but_nothing_negative_or_infinite() -> None:
    parser = build_parser()
    assert config_from_args(parser.parse_args([])).adopt_grace_s == ADOPT_GRACE_S
    assert config_from_args(parser.parse_args(["--adopt-grace", "0"])).adopt_grace_s == 0.0
    assert config_from_args(parser.parse_args(["--adopt-grace", "1500ms"])).adopt_grace_s == 1.5
    for bad in ("-1", "inf", "nan", "soon"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--adopt-grace", bad])
