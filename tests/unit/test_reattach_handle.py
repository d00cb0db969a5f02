"""Detach and reattach's pure parts (issue 40): the record's hand-over, the keep's bound,
the handle's JSON and its repr."""

from __future__ import annotations

import math
import secrets

import msgspec
import pytest

from sbxkit._consumers.handle import SandboxHandle, keep_for
from sbxkit._model.settings import Settings
from sbxkit._model.spec import Limits, SandboxSpec
from sbxkit._plan.plan import Plan
from sbxkit._protocol.proof import (
    MAX_SPENT,
    check_proof,
    detach_problem,
    handed_over,
    rotated,
    secret_hash,
)
from sbxkit._protocol.records import decode_record, encode_record
from sbxkit.engine.models import ContainerCreate
from sbxkit.errors import SbxError
from tests.unit.test_readoption import LEASE, record


def test_a_detach_hands_the_lease_to_the_handles_secret_only() -> None:
    mine, handles = secrets.token_hex(32), secrets.token_hex(32)
    kept = handed_over(record(mine), secret_hash(handles), until=50.0)
    assert kept.detached_until == 50.0
    assert check_proof(kept, handles, secret_hash(secrets.token_hex(32))) == "accepted"
    assert check_proof(kept, mine, secret_hash(secrets.token_hex(32))) == "replayed"
    assert check_proof(kept, secrets.token_hex(32), secret_hash(handles)) == "wrong"
    # the record as journaled reads back the same, and a reattach attaches it again
    assert decode_record("x", encode_record(kept)) == kept
    reattached = rotated(kept, handles, secret_hash(secrets.token_hex(32)))
    assert reattached.detached_until is None
    assert check_proof(reattached, handles, secret_hash(secrets.token_hex(32))) == "replayed"
    assert len(handed_over(reattached, secret_hash(mine), 9.0).spent_hashes) <= MAX_SPENT


def test_the_keep_never_outlasts_the_lifetime() -> None:
    kept = handed_over(record(secrets.token_hex(32)), secret_hash("b" * 64), until=1e9)
    assert kept.detached_until == 100.0


@pytest.mark.parametrize(
    ("keep_s", "fresh", "now", "problem"),
    [
        (10.0, True, 1.0, None),
        (0.0, True, 1.0, "keep_s must be a positive"),
        (-1.0, True, 1.0, "keep_s must be a positive"),
        (math.inf, True, 1.0, "keep_s must be a positive"),
        (math.nan, True, 1.0, "keep_s must be a positive"),
        (10.0, False, 1.0, "a fresh one"),
        (10.0, True, 100.0, "lifetime deadline passed"),
    ],
)
def test_what_a_detach_refuses(keep_s: float, fresh: bool, now: float, problem: str | None) -> None:
    mine = secrets.token_hex(32)
    offered = secret_hash(secrets.token_hex(32) if fresh else mine)
    said = detach_problem(record(mine), offered, keep_s, now)
    assert said is None if problem is None else problem in (said or "")


def test_a_lease_not_created_or_a_malformed_hash_is_not_detached() -> None:
    mine = secrets.token_hex(32)
    creating = record(mine, state="creating", container_id=None)
    assert (
        detach_problem(creating, secret_hash("c" * 64), 5, 1.0) == "the lease has no container yet"
    )
    assert "64 hex digits" in (detach_problem(record(mine), "nope", 5, 1.0) or "")


def test_keep_for_is_bounded_by_the_session() -> None:
    assert keep_for(600, 30.0) == 30.0
    assert keep_for(5, 30.0) == 5.0
    for bad in (0, -2, math.inf, math.nan):
        with pytest.raises(SbxError, match="keep_s"):
            keep_for(bad, 30.0)
    with pytest.raises(SbxError, match="time limit has passed"):
        keep_for(5, 0.0)


def handle() -> SandboxHandle:
    spec = SandboxSpec(image="busybox", command=["sleep", "1"], limits=Limits(timeout_s=10))
    plan = Plan(
        spec=spec,
        settings=Settings(environment=b"\xff not utf-8"),
        lease=LEASE,
        name=f"sbxkit-{LEASE}",
        body=ContainerCreate(image="busybox", user="1000:1000"),
        expected_mounts=(),
        timeout_s=10.0,
        output_bytes=1 << 20,
        lifetime_s=70.0,
    )
    return SandboxHandle(
        lease=LEASE,
        container_id="c" * 64,
        secret=secrets.token_hex(32),
        state_dir="/tmp/s",
        engine_socket="/run/docker.sock",
        keep_until=123.0,
        deadline=456.0,
        files_root="/tmp",
        max_processes=8,
        plan=plan,
    )


def test_a_handle_round_trips_through_json_and_hides_its_secret() -> None:
    one = handle()
    assert SandboxHandle.from_json(one.to_json()) == one
    assert SandboxHandle.from_json(one.to_json().decode()) == one
    assert one.secret not in repr(one)
    assert "hidden" in repr(one)


def test_what_is_not_a_handle_is_an_sbx_error() -> None:
    for data in (b"", b"{}", b"[1]", b'{"lease": 3}'):
        with pytest.raises(SbxError, match="not a sandbox handle"):
            SandboxHandle.from_json(data)
    later = msgspec.structs.replace(handle(), version=2)
    with pytest.raises(SbxError, match="version 2"):
        SandboxHandle.from_json(later.to_json())
