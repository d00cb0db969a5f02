"""The pool's settings: ``[sandbox.docker.pool]`` in a profile and ``sbxkit batch --pool``."""

from __future__ import annotations

import argparse

import pytest

from sbxkit._grammar.profile import PoolOptions, decode_profile
from sbxkit.cli.batch import batch_pool
from sbxkit.errors import SpecError

BASE = '[sandbox.docker]\nimage = "img:1"\n'


def test_a_profile_pool_decodes_with_defaults() -> None:
    profile = decode_profile(BASE + "[sandbox.docker.pool]\nsize = 4\n")
    assert profile.sandbox.docker.pool == PoolOptions(size=4, idle_ttl=300.0, max_timeout=600.0)
    assert decode_profile(BASE).sandbox.docker.pool is None


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ("size = 0", "sandbox.docker.pool.size"),
        ("size = 257", "sandbox.docker.pool.size"),
        ("size = 2\nidle_ttl = 0", "sandbox.docker.pool.idle_ttl"),
        ("size = 2\nmax_timeout = inf", "sandbox.docker.pool.max_timeout"),
        ("size = 2\nttl = 5", "sandbox.docker.pool.ttl"),
        ("idle_ttl = 5", "sandbox.docker.pool.size"),
    ],
)
def test_bad_pool_settings_name_their_path(table: str, field: str) -> None:
    with pytest.raises(SpecError) as caught:
        decode_profile(BASE + "[sandbox.docker.pool]\n" + table + "\n")
    assert caught.value.field == field


def test_the_batch_pool_comes_from_the_profile_or_the_flag() -> None:
    flag = argparse.Namespace(pool=True, parallel=6)
    none = argparse.Namespace(pool=False, parallel=6)
    profile = decode_profile(BASE + "[sandbox.docker.pool]\nsize = 3\nidle_ttl = 30\n")
    assert batch_pool(flag, None) == PoolOptions(size=6)
    assert batch_pool(none, None) is None
    assert batch_pool(none, profile) == PoolOptions(size=3, idle_ttl=30.0)
