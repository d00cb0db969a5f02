"""A held pool's template (``sbxkit.supervisor.templates``): pure, no supervisor, no daemon.

The supervisor creates every parked container from a caller's template under a lease of its
own: the template's lease may sit only where policy puts a lease, the body for a new lease
differs from the template in exactly those places and passes the supervisor's re-check, and
two claims name the same pool exactly when their parked containers would be alike.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbxkit._model.rules import LEASE_LABEL
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit._plan.policy import build_create_body
from sbxkit._protocol.wire import Claim, PoolTerms, Register, Reservation
from sbxkit.pool import PARK_SCRIPT
from sbxkit.supervisor.recheck import recheck_body
from sbxkit.supervisor.templates import body_for_lease, shape_key, template_problem

TEMPLATE_LEASE = "a" * 32
TERMS = PoolTerms(size=2, idle_ttl_s=300.0, max_timeout_s=600.0)
leases = st.text("0123456789abcdef", min_size=32, max_size=32)


def claim(lease: str = TEMPLATE_LEASE, terms: PoolTerms = TERMS, **spec_fields: Any) -> Claim:
    fields: dict[str, Any] = {
        "image": "sbxkit-test/busybox:latest",
        "command": ["sh", "-c", PARK_SCRIPT],
        "limits": Limits(cpus=1, memory_bytes=64 * MiB, pids=64, output_bytes=1, timeout_s=900),
        **spec_fields,
    }
    body = build_create_body(SandboxSpec(**fields), lease)
    assert body.host_config is not None
    assert body.host_config.memory is not None
    assert body.host_config.nano_cpus is not None
    register = Register(
        lease=lease,
        name=f"sbxkit-{lease}",
        engine_socket="/var/run/docker.sock",
        body=body,
        reservation=Reservation(
            memory_bytes=body.host_config.memory, nano_cpus=body.host_config.nano_cpus
        ),
        startup_deadline_s=30.0,
        lifetime_deadline_s=930.0,
    )
    return Claim(template=register, terms=terms, expected_mounts=[])


@given(leases)
def test_the_body_for_a_new_lease_is_the_template_but_for_the_lease(lease: str) -> None:
    template = claim().template
    body = body_for_lease(template.body, TEMPLATE_LEASE, lease)
    assert body.labels is not None
    assert body.labels[LEASE_LABEL] == lease
    assert f"SBXKIT_LEASE={lease}" in (body.env or [])
    # Put the template lease back: byte for byte the template.
    again = body_for_lease(body, lease, TEMPLATE_LEASE)
    assert msgspec.json.encode(again) == msgspec.json.encode(template.body)
    assert policy_body(lease) == body  # what policy itself builds for that lease
    problem = recheck_body(body, lease=lease, state_dir="/nonexistent-state", environment=None)
    assert problem is None


def policy_body(lease: str) -> Any:
    return claim(lease).template.body


@given(leases)
def test_claims_of_one_shape_name_one_pool_whatever_their_template_lease(lease: str) -> None:
    assert shape_key(claim(lease)) == shape_key(claim())
    # The pool's terms are not its shape: a claim with other terms names the same pool.
    other_terms = PoolTerms(size=1, idle_ttl_s=5.0, max_timeout_s=5.0)
    assert shape_key(claim(lease, terms=other_terms)) == shape_key(claim())


@pytest.mark.parametrize(
    "change",
    [
        {"image": "sbxkit-test/python:latest"},
        {"user": "1001:1001"},
        {"workdir": "/tmp"},
        {"labels": {"team": "x"}},
        {"runtime": "crun"},
        {"limits": Limits(cpus=1, memory_bytes=128 * MiB, pids=64, output_bytes=1, timeout_s=900)},
    ],
)
def test_a_different_shape_is_a_different_pool(change: dict[str, Any]) -> None:
    assert shape_key(claim(**change)) != shape_key(claim())


def test_a_template_whose_lease_appears_elsewhere_is_refused() -> None:
    assert template_problem(claim()) is None
    smuggled = claim(labels={"copy": TEMPLATE_LEASE})
    assert template_problem(smuggled) == (
        "the template's lease appears in its body beyond the lease label, SBXKIT_LEASE "
        "and its FIFO directory"
    )
    renamed = msgspec.structs.replace(claim().template, name="sbxkit-other")
    problem = template_problem(msgspec.structs.replace(claim(), template=renamed))
    assert problem == f"the template's name must be sbxkit-{TEMPLATE_LEASE}"


@pytest.mark.parametrize(
    ("terms", "problem"),
    [
        (PoolTerms(size=0, idle_ttl_s=1.0, max_timeout_s=1.0), "pool size must be 1..256"),
        (PoolTerms(size=257, idle_ttl_s=1.0, max_timeout_s=1.0), "pool size must be 1..256"),
        (PoolTerms(size=1, idle_ttl_s=float("nan"), max_timeout_s=1.0), "idle_ttl_s must be"),
        (PoolTerms(size=1, idle_ttl_s=1.0, max_timeout_s=0.0), "max_timeout_s must be"),
        (PoolTerms(size=1, idle_ttl_s=1.0, max_timeout_s=1e9), "max_timeout_s must be"),
    ],
)
def test_pool_terms_out_of_range_are_refused(terms: PoolTerms, problem: str) -> None:
    found = template_problem(claim(terms=terms))
    assert found is not None
    assert found.startswith(problem)
