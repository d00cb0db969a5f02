"""A uid of its own per sandbox (sbxkit._model.uids, sbxkit._lifecycle.uid_holds): the ranges, the
lease's uid, the holds, and the refusals of a named user inside the ranges."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbxkit._lifecycle import uid_holds
from sbxkit._lifecycle.uid_holds import abstract_name, hold_own_uid, hold_uid, host_id_problem
from sbxkit._model.spec import Limits, MiB, SandboxSpec, validate_user
from sbxkit._model.uids import (
    HOST_UIDS,
    MAPPED_UIDS,
    body_with_uid,
    own_range,
    reserved_range_of,
    uid_for_lease,
)
from sbxkit._plan.policy import build_create_body
from sbxkit.errors import SpecError
from sbxkit.supervisor.templates import PLACEHOLDER_LEASE, body_for_lease

LEASES = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)


def spec(**overrides: object) -> SandboxSpec:
    values: dict[str, object] = {
        "image": "busybox",
        "command": ["true"],
        "limits": Limits(
            cpus=1,
            memory_bytes=64 * MiB,
            pids=16,
            output_bytes=1024,
            timeout_s=5,
            scratch_bytes=MiB,
        ),
    }
    values.update(overrides)
    return SandboxSpec(**values)  # type: ignore[arg-type]


def test_the_ranges_hold_no_account_id_nobody_or_minus_one_and_do_not_overlap() -> None:
    assert HOST_UIDS.first == 0x7000_0000
    assert HOST_UIDS.last == 0x7000_FFFF
    assert MAPPED_UIDS.first == 61440
    assert MAPPED_UIDS.last == 65533
    assert HOST_UIDS.last < 2**31 - 1  # runc's and the spec's id ceiling
    assert MAPPED_UIDS.last < HOST_UIDS.first


@given(LEASES)
def test_a_lease_has_one_uid_in_each_range_the_same_every_time(lease: str) -> None:
    for uids in (HOST_UIDS, MAPPED_UIDS):
        uid = uid_for_lease(lease, uids)
        assert uid in uids
        assert uid == uid_for_lease(lease, uids)
        assert own_range(f"{uid}:{uid}", lease) == uids


def test_random_leases_spread_over_the_range() -> None:
    uids = {uid_for_lease(secrets.token_hex(16), HOST_UIDS) for _ in range(2000)}
    assert len(uids) > 1950  # 2000 draws from 65536 ids: a few dozen collisions at most


@given(LEASES, st.integers(min_value=1, max_value=2**31 - 1))
def test_a_named_user_is_not_the_leases_own_unless_it_is_its_uid(lease: str, uid: int) -> None:
    own = own_range(f"{uid}:{uid}", lease)
    assert own is None or uid == uid_for_lease(lease, own)
    assert own_range(f"{uid}:{uid + 1}", lease) is None  # a gid of its own is the uid
    assert own_range(None, lease) is None


def test_a_spec_without_a_user_runs_as_its_leases_own_uid() -> None:
    lease = secrets.token_hex(16)
    uid = uid_for_lease(lease, HOST_UIDS)
    body = build_create_body(spec(), lease)
    assert body.user == f"{uid}:{uid}"
    assert body.host_config is not None
    assert body.host_config.tmpfs is not None
    assert body.host_config.tmpfs["/tmp"].endswith(f",uid={uid},gid={uid}")
    named = build_create_body(spec(user="1000:1000"), lease)
    assert named.user == "1000:1000"


@pytest.mark.parametrize("user", ["1879048192:1000", "1000:1879113727", "61440:61440", "65533:1"])
def test_a_named_user_inside_the_ranges_is_refused_by_name(user: str) -> None:
    with pytest.raises(SpecError, match=r"user: id \d+ is in the ranges sbxkit gives"):
        validate_user(user)


@pytest.mark.parametrize("user", [None, "1000:1000", "65534:65534", "61439:1879048191"])
def test_a_named_user_outside_them_passes(user: str | None) -> None:
    validate_user(user)
    assert reserved_range_of(60000) is None


def test_only_the_uid_options_of_a_tmpfs_move_with_the_uid() -> None:
    lease = secrets.token_hex(16)
    old = uid_for_lease(lease, HOST_UIDS)
    body = build_create_body(spec(), lease)
    assert body.host_config is not None
    host = msgspec.structs.replace(
        body.host_config,
        tmpfs={**(body.host_config.tmpfs or {}), "/x": f"size={old},mode=700,uid={old},gid={old}"},
    )
    moved = body_with_uid(msgspec.structs.replace(body, host_config=host), old, 7)
    assert moved.user == "7:7"
    assert moved.host_config is not None
    assert moved.host_config.tmpfs is not None
    assert moved.host_config.tmpfs["/x"] == f"size={old},mode=700,uid=7,gid=7"


def test_a_parked_container_takes_the_uid_of_its_own_lease() -> None:
    template_lease, lease = secrets.token_hex(16), secrets.token_hex(16)
    template = build_create_body(spec(), template_lease)
    parked = body_for_lease(template, template_lease, lease)
    uid = uid_for_lease(lease, HOST_UIDS)
    assert parked.user == f"{uid}:{uid}"
    assert str(uid_for_lease(template_lease, HOST_UIDS)) not in msgspec.json.encode(parked).decode()
    # Two templates of one shape park the same body but for the lease.
    other = secrets.token_hex(16)
    twin = build_create_body(spec(), other)
    assert body_for_lease(twin, other, PLACEHOLDER_LEASE) == body_for_lease(
        template, template_lease, PLACEHOLDER_LEASE
    )
    named = build_create_body(spec(user="1000:1000"), template_lease)
    assert body_for_lease(named, template_lease, lease).user == "1000:1000"


def test_a_uid_is_held_by_one_socket_at_a_time_and_free_again_once_let_go() -> None:
    lease = secrets.token_hex(16)
    body = build_create_body(spec(), lease)
    first = hold_own_uid(lease, body)
    assert isinstance(first, uid_holds.UidHold)
    assert first.held
    second = hold_own_uid(lease, body)
    assert isinstance(second, str)
    assert "held by another process" in second
    first.release()
    first.release()  # idempotent
    again = hold_own_uid(lease, body)
    assert isinstance(again, uid_holds.UidHold)
    again.release()
    assert hold_own_uid(lease, build_create_body(spec(user="1000:1000"), lease)) is None


def test_a_name_another_process_bound_keeps_the_uid_from_sbxkit() -> None:
    uid = uid_for_lease(secrets.token_hex(16), MAPPED_UIDS)
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # names are per socket type
    try:
        squatter.bind(abstract_name(uid))
        assert "held by another process" in str(hold_uid(uid, MAPPED_UIDS))
    finally:
        squatter.close()


def test_a_host_account_group_or_subordinate_range_is_never_a_sandboxs_uid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert host_id_problem(0) == "uid 0 is the host account 'root'"
    assert "is the host" in str(hold_uid(0, HOST_UIDS))
    subuid = tmp_path / "subuid"
    subuid.write_text(f"alice:{HOST_UIDS.first + 10}:65536\nbroken line\n")
    monkeypatch.setattr(uid_holds, "SUBORDINATE_FILES", (str(subuid),))
    assert host_id_problem(HOST_UIDS.first + 9) is None
    problem = host_id_problem(HOST_UIDS.first + 10)
    assert problem == f"uid {HOST_UIDS.first + 10} is in 'alice''s subordinate ids ({subuid})"
    # Under a mapping daemon the container's uids are not the host's: accounts do not matter.
    held = hold_uid(HOST_UIDS.first + 10, MAPPED_UIDS)
    assert isinstance(held, uid_holds.UidHold)
    held.release()
