"""Warm interpreters (issue 44 item 2) on the real engine: parked with their modules imported,
each claimed by one session only and removed after it, refilled off the claim's path, the
session's time limit counted from the claim, a preload that cannot import refused by name. The
autouse witness proves no container is left after each test."""

from __future__ import annotations

import pytest
import trio

from sbxkit._consumers.interp_pool import open_interpreter_pool
from sbxkit._model.spec import SandboxSpec
from sbxkit.engine.client import Engine
from sbxkit.errors import ImageError, SandboxExpired, SpecError
from tests.engine.helpers import container_exists
from tests.engine.test_session import session_spec
from tests.witness import Witness

KILL_INTERPRETER = (
    "import os\n"
    "mark = b'import ' + b'ast, base64'  # the interpreter's source, not this one's\n"
    "pids = [p for p in os.listdir('/proc') if p.isdigit()\n"
    "        and mark in open('/proc/%s/cmdline' % p, 'rb').read()]\n"
    "for p in pids: os.kill(int(p), 9)\n"
    "print(len(pids))"
)
LOADED = "import sys\nsorted(m for m in ('numpy', 'pandas', 'tomllib') if m in sys.modules)"


def spec(image: str, **overrides: object) -> SandboxSpec:
    overrides.setdefault("timeout_s", 60)
    overrides.setdefault("memory_bytes", 512 * 1024 * 1024)
    return session_spec(image, None, **overrides)


async def test_a_warm_interpreter_has_its_modules_imported_and_serves_one_session(
    pydata_image: str, engine: Engine, witness: Witness
) -> None:
    async with open_interpreter_pool(
        spec(pydata_image), size=2, preload=["numpy", "pandas"], engine=engine
    ) as pool:
        await pool.wait_ready()
        parked = {slot.interpreter.sandbox.container_id for slot in pool.parking.ready}
        assert len(parked) == 2
        async with pool.interpreter() as first:
            assert first.warm
            assert first.sandbox.container_id in parked
            loaded = await first.run_code(LOADED)
            assert loaded.text == "['numpy', 'pandas']"  # imported before the claim; not tomllib
            total = await first.run_code("import numpy\nnumpy.arange(10).sum()")
            assert total.text == "np.int64(45)"
            await first.run_code("secret = 'first session'")
            used = first.sandbox.container_id
        assert not container_exists(witness, used)  # single use: removed with its block
        async with pool.interpreter() as second:
            assert second.warm
            assert second.sandbox.container_id != used
            assert (await second.run_code("'secret' in dir()")).text == "False"
        await pool.wait_ready()  # refilled in the pool's own tasks
        assert pool.claims == {"warm": 2, "cold": 0}
        now = {slot.interpreter.sandbox.container_id for slot in pool.parking.ready}
        assert len(now) == 2
        assert not now & parked
    for container in parked | now:
        assert not container_exists(witness, container)


async def test_the_time_limit_counts_from_the_claim_not_the_park(
    python_image: str, engine: Engine
) -> None:
    async with open_interpreter_pool(
        spec(python_image, timeout_s=4), size=1, preload=["tomllib"], engine=engine
    ) as pool:
        await pool.wait_ready()
        await trio.sleep(5)  # parked for longer than the session's whole limit
        seen: list[object] = []

        async def session() -> None:
            async with pool.interpreter() as interp:
                claimed_by = trio.current_time()
                assert interp.warm
                seen.append(0 < interp.sandbox.deadline - claimed_by <= 4)
                seen.append((await interp.run_code(LOADED)).text)
                await trio.sleep(30)  # the block itself: cancelled at the session's limit

        t0 = trio.current_time()
        with pytest.raises(SandboxExpired, match="time limit of 4 s"):
            await session()
        assert seen == [True, "['tomllib']"]
        assert 4 <= trio.current_time() - t0 < 4 + 10


async def test_a_preload_that_does_not_import_is_refused_by_name(
    python_image: str, engine: Engine
) -> None:
    async with open_interpreter_pool(
        spec(python_image), size=1, preload=["json", "no_such_module_44"], engine=engine
    ) as pool:
        with pytest.raises(ImageError, match="preload no_such_module_44: ModuleNotFoundError"):
            await pool.wait_ready()
        with pytest.raises(ImageError, match="no_such_module_44"):  # cold: the same refusal
            async with pool.interpreter():
                pass
        assert pool.claims == {"warm": 0, "cold": 1}


async def test_bad_pool_arguments_are_refused_before_any_container(python_image: str) -> None:
    with pytest.raises(SpecError, match="preload: must be a list of module names, got str"):
        async with open_interpreter_pool(spec(python_image), size=1, preload="numpy"):
            pass
    with pytest.raises(SpecError, match=r"pool\.size: must be an integer from 1 to"):
        async with open_interpreter_pool(spec(python_image), size=0):
            pass


async def test_an_interpreter_that_died_while_parked_is_never_handed_out(
    python_image: str, engine: Engine, witness: Witness
) -> None:
    async with open_interpreter_pool(
        spec(python_image), size=1, preload=["tomllib"], engine=engine
    ) as pool:
        await pool.wait_ready()
        (parked,) = pool.parking.ready
        dead = parked.interpreter
        # The code's own way to end it: a parked interpreter has no call, so kill its process
        # from a second exec in its sandbox, as a crash would.
        killed = await dead.sandbox.exec(["python3", "-c", KILL_INTERPRETER])
        assert (killed.status, killed.exit_code) == ("exited", 0)
        assert int(killed.stdout) >= 1  # the interpreter (and the exec wrapper naming it)
        with trio.fail_after(10):
            while dead._gen is not None and dead._gen.process is not None:
                if dead._gen.process.exit is not None:
                    break
                await trio.sleep(0.05)
        async with pool.interpreter() as interp:
            assert interp is not dead
            assert interp.sandbox.container_id != dead.sandbox.container_id
            assert (await interp.run_code(LOADED)).text == "['tomllib']"
        assert not container_exists(witness, dead.sandbox.container_id)
