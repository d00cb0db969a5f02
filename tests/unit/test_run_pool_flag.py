"""``sbxkit run --pool N`` and a profile's ``[sandbox.docker.pool]``: which held pool a run
claims from (docs/pool.md), refused before anything is contacted when it is bad."""

from __future__ import annotations

import argparse

import pytest

from sbxkit._grammar.backend_choice import cli_backend
from sbxkit._grammar.profile import PoolOptions, decode_profile
from sbxkit._grammar.run_grammar import run_pool
from sbxkit.errors import SpecError
from sbxkit.pool.held import HeldPool, PooledBackend

BASE = '[sandbox.docker]\nimage = "img:1"\n'
POOLED = decode_profile(BASE + "[sandbox.docker.pool]\nsize = 3\nidle_ttl = 30\n")


def test_the_flag_sizes_the_pool_and_keeps_the_profiles_other_terms() -> None:
    assert run_pool(argparse.Namespace(pool="4"), None) == PoolOptions(size=4)
    assert run_pool(argparse.Namespace(pool="4"), POOLED) == PoolOptions(size=4, idle_ttl=30.0)
    assert run_pool(argparse.Namespace(pool=None), POOLED) == PoolOptions(size=3, idle_ttl=30.0)
    assert run_pool(argparse.Namespace(pool=None), decode_profile(BASE)) is None
    assert run_pool(argparse.Namespace(pool=None), None) is None


@pytest.mark.parametrize("value", ["0", "257", "-1", "x", "1.5", "", "٣"])
def test_a_bad_pool_size_names_the_flag(value: str) -> None:
    with pytest.raises(SpecError) as caught:
        run_pool(argparse.Namespace(pool=value), None)
    assert caught.value.field == "--pool"


def test_a_pooled_run_gets_a_backend_that_claims_from_the_supervisor() -> None:
    backend = cli_backend(None, socket_path=None, settings=None, pool=PoolOptions(size=2))
    assert isinstance(backend, PooledBackend)
    assert backend.pool == HeldPool(size=2)
    assert type(cli_backend(None, socket_path=None, settings=None)).__name__ == "DockerBackend"


def test_a_pool_under_the_sandbox_runtime_is_refused() -> None:
    profile = decode_profile('[sandbox]\nruntime = "sandbox"\n[sandbox.docker]\nimage = "i:1"\n')
    with pytest.raises(SpecError) as caught:
        cli_backend(profile, socket_path=None, settings=None, pool=PoolOptions(size=2))
    assert caught.value.field == "--pool"
