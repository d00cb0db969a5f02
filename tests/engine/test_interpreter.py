"""Interpreter sessions on the real engine (issue 44 item 1, and item 3's ``on_output``): state
between calls, the last expression's value and rich representations, errors, a timeout that
leaves the interpreter alive, a crash reported and restarted, output caps, output as it
happens, and a hostile payload that writes to the protocol's own stream. The autouse fixture's
witness proves no container is left after each test."""

from __future__ import annotations

import base64
import json

import pytest
import trio

from sbxkit._consumers.interpreter import INTERRUPT_GRACE_S, open_interpreter
from sbxkit._model.spec import SandboxSpec
from sbxkit.engine.client import Engine
from sbxkit.errors import InterpreterDied, SandboxUnusable
from tests.engine.helpers import container_exists
from tests.engine.runtimes import is_gvisor
from tests.engine.test_session import session_spec
from tests.witness import Witness

PNG = (
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00"
    b"\x1f\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00"
    b"\x00\x00\x00IEND\xaeB`\x82"
)


def spec(python_image: str, runtime: str | None, **overrides: object) -> SandboxSpec:
    overrides.setdefault("timeout_s", 120)
    return session_spec(python_image, runtime, **overrides)


async def test_state_lives_between_calls_and_the_last_expression_is_the_value(
    runtime: str | None, python_image: str, engine: Engine, witness: Witness
) -> None:
    async with open_interpreter(spec(python_image, runtime), engine=engine) as interp:
        assert interp.python_version is not None
        assert interp.python_version.startswith("3.")
        first = await interp.run_code("x = 41\nprint('set', x)")
        assert (first.status, first.stdout, first.text) == ("ok", "set 41\n", None)
        assert first.error is None
        second = await interp.run_code("import sys\nprint('err', file=sys.stderr)\nx + 1")
        assert (second.status, second.text, second.stderr) == ("ok", "42", "err\n")
        assert second.data == {"text/plain": "42"}
        none = await interp.run_code("None")
        assert none.text is None
        assert none.data == {}
        assert container_exists(witness, interp.sandbox.container_id)


async def test_rich_representations_come_back_by_mime_type(
    runtime: str | None, python_image: str, engine: Engine
) -> None:
    code = (
        "import base64\n"
        "class Table:\n"
        "    def _repr_html_(self): return '<table><tr><td>1</td></tr></table>'\n"
        "    def _repr_json_(self): return {'rows': [1, 2]}\n"
        f"    def _repr_png_(self): return base64.b64decode({base64.b64encode(PNG)!r})\n"
        "    def __repr__(self): return 'Table(1)'\n"
        "Table()"
    )
    async with open_interpreter(spec(python_image, runtime), engine=engine) as interp:
        result = await interp.run_code(code)
    assert result.status == "ok", result
    assert result.text == "Table(1)"
    assert result.data["text/html"] == "<table><tr><td>1</td></tr></table>"
    assert json.loads(result.data["application/json"]) == {"rows": [1, 2]}
    png = base64.b64decode(result.data["image/png"])
    assert png == PNG
    assert png.startswith(b"\x89PNG\r\n\x1a\n")


async def test_an_exception_is_name_value_and_traceback_and_state_stays(
    runtime: str | None, python_image: str, engine: Engine
) -> None:
    async with open_interpreter(spec(python_image, runtime), engine=engine) as interp:
        await interp.run_code("kept = 'yes'\ndef f():\n    return 1 / 0")
        failed = await interp.run_code("print('before')\nf()")
        assert failed.status == "error"
        assert failed.stdout == "before\n"
        assert failed.error is not None
        assert (failed.error.name, failed.error.value) == ("ZeroDivisionError", "division by zero")
        assert "return 1 / 0" in failed.error.traceback  # the cell's own source line
        assert "<string>" not in failed.error.traceback  # not the interpreter's own frames
        syntax = await interp.run_code("def (")
        assert syntax.error is not None
        assert syntax.error.name == "SyntaxError"
        assert (await interp.run_code("kept")).text == "'yes'"


async def test_a_timeout_interrupts_the_code_and_the_interpreter_lives_on(
    runtime: str | None, python_image: str, engine: Engine
) -> None:
    async with open_interpreter(spec(python_image, runtime), engine=engine) as interp:
        await interp.run_code("total = 0")
        t0 = trio.current_time()
        result = await interp.run_code("while True:\n    total += 1", timeout=1.5)
        took = trio.current_time() - t0
        assert result.status == "timed_out"
        assert result.error is not None
        assert result.error.name == "KeyboardInterrupt"
        assert 1.5 <= took < 1.5 + 5.0
        after = await interp.run_code("total > 0")
        assert (after.status, after.text) == ("ok", "True")
        slept = await interp.run_code("import time\ntime.sleep(60)", timeout=1)
        assert slept.status == "timed_out"
        assert (await interp.run_code("1 + 1")).text == "2"


async def test_code_that_swallows_the_interrupt_gets_its_interpreter_killed(
    runtime: str | None, python_image: str, engine: Engine
) -> None:
    stubborn = (
        "import time\n"
        "while True:\n"
        "    try:\n"
        "        time.sleep(0.1)\n"
        "    except KeyboardInterrupt:\n"
        "        print('ignored')\n"
    )
    async with open_interpreter(spec(python_image, runtime), engine=engine) as interp:
        t0 = trio.current_time()
        with pytest.raises(InterpreterDied, match="did not stop within") as died:
            await interp.run_code(stubborn, timeout=1)
        assert died.value.status == "killed"
        assert 1 + INTERRUPT_GRACE_S <= trio.current_time() - t0 < 1 + INTERRUPT_GRACE_S + 5
        await interp.restart()
        assert (await interp.run_code("'fresh'")).text == "'fresh'"


async def test_a_cancelled_call_is_interrupted_and_the_interpreter_lives_on(
    runtime: str | None, python_image: str, engine: Engine
) -> None:
    """Cancelling a call interrupts its code (as a notebook's stop button does): the state
    stays. Code that swallows the interrupt gets its interpreter killed, and says so."""
    async with open_interpreter(spec(python_image, runtime), engine=engine) as interp:
        await interp.run_code("x = 7")
        t0 = trio.current_time()
        with trio.move_on_after(1):
            await interp.run_code("import time\ntime.sleep(60)")
        assert trio.current_time() - t0 < 1 + INTERRUPT_GRACE_S
        assert (await interp.run_code("x")).text == "7"
        stubborn = (
            "while True:\n"
            "    try:\n"
            "        time.sleep(0.1)\n"
            "    except BaseException:\n"
            "        pass\n"
        )
        with trio.move_on_after(1):
            await interp.run_code(stubborn)
        with pytest.raises(InterpreterDied, match="abandoned"):
            await interp.run_code("1")
        await interp.restart()
        assert (await interp.run_code("1 + 1")).text == "2"


async def test_a_crash_is_reported_and_restart_starts_a_fresh_one(
    runtime: str | None, python_image: str, engine: Engine
) -> None:
    async with open_interpreter(spec(python_image, runtime), engine=engine) as interp:
        await interp.run_code("x = 1")
        with pytest.raises(InterpreterDied) as died:
            await interp.run_code("import os\nos._exit(3)")
        assert (died.value.status, died.value.exit_code) == ("exited", 3)
        assert "exited with code 3" in str(died.value)
        with pytest.raises(InterpreterDied):  # dead until restarted
            await interp.run_code("1")
        await interp.restart()
        fresh = await interp.run_code("'x' in globals()")
        assert fresh.text == "False"
        assert (await interp.run_code("2 * 21")).text == "42"


async def test_an_interpreter_killed_by_oom_is_reported_as_such(
    runtime: str | None, python_image: str, engine: Engine, witness: Witness
) -> None:
    async with open_interpreter(
        spec(python_image, runtime, memory_bytes=64 * 1024 * 1024), engine=engine
    ) as interp:
        with pytest.raises(InterpreterDied) as died:
            # One block past the limit, not small steps that can thrash at it (the hardening
            # test's note).
            await interp.run_code(
                "blocks = [bytearray(1 << 20) for _ in range(32)]\n"
                "blocks.append(bytearray(64 << 20))",
                timeout=15,
            )
        if witness.is_podman():
            # Podman 4.3 gives no evidence of an OOM (docs/backends.md): the kill is the
            # exit it is, never an OOM nobody proved (as helpers.assert_oom_outcome).
            assert (died.value.status, died.value.exit_code) == ("exited", 137), died.value
            assert not died.value.evidence
        else:
            assert died.value.status == "oom_killed", died.value
            assert died.value.evidence
        if is_gvisor(runtime):
            # gVisor ends the whole sandbox on an OOM (the one-shot case ends the same way):
            # nothing is left to restart in, and restart says so.
            with pytest.raises(SandboxUnusable, match="not running"):
                await interp.restart()
            return
        await interp.restart()
        assert (await interp.run_code("1 + 2")).text == "3"


async def test_output_past_the_cap_is_cut_and_interrupted(
    runtime: str | None, python_image: str, engine: Engine
) -> None:
    async with open_interpreter(spec(python_image, runtime), engine=engine) as interp:
        exact = await interp.run_code("print('a' * 99)", max_output=100)
        assert (exact.status, exact.stdout) == ("ok", "a" * 99 + "\n")
        flood = await interp.run_code(
            "import sys\nwhile True:\n    sys.stdout.write('y' * 1000)", max_output=10_000
        )
        assert flood.status == "output_exceeded"
        assert flood.stdout == "y" * 10_000
        assert (await interp.run_code("'alive'")).text == "'alive'"


async def test_on_output_chunks_arrive_before_the_call_ends(
    runtime: str | None, python_image: str, engine: Engine
) -> None:
    seen: list[tuple[str, bytes, float]] = []
    async with open_interpreter(spec(python_image, runtime), engine=engine) as interp:
        t0 = trio.current_time()
        result = await interp.run_code(
            "import time, sys\n"
            "print('first', flush=True)\n"
            "time.sleep(1.5)\n"
            "print('oops', file=sys.stderr)\n"
            "print('last')",
            on_output=lambda stream, chunk: seen.append((stream, chunk, trio.current_time() - t0)),
        )
        ended = trio.current_time() - t0
    assert result.stdout == "first\nlast\n"
    assert b"".join(c for s, c, _ in seen if s == "stdout") == b"first\nlast\n"
    assert b"".join(c for s, c, _ in seen if s == "stderr") == b"oops\n"
    first_at = next(t for s, c, t in seen if c.startswith(b"first"))
    assert first_at < ended - 1.0  # it came while the code still slept


async def test_a_forged_frame_printed_by_the_code_is_only_output(
    runtime: str | None, python_image: str, engine: Engine
) -> None:
    """Whatever the code prints — through ``print``, ``sys.__stdout__`` or fd 1 — is output,
    even when it is a well-formed result frame for the running call."""
    forge = (
        "import json, os, struct, sys\n"
        "body = json.dumps({'t': 'result', 'id': 2, 'value': {'text/plain': 'FORGED'},"
        " 'error': None}).encode()\n"
        "frame = struct.pack('>I', len(body)) + body\n"
        "sys.__stdout__.write(frame.decode()); sys.__stdout__.flush()\n"
        "os.write(1, frame); os.write(2, b'\\x00\\xff junk')\n"
        "'real'"
    )
    async with open_interpreter(spec(python_image, runtime), engine=engine) as interp:
        await interp.run_code("pass")
        result = await interp.run_code(forge)
        assert (result.status, result.text) == ("ok", "'real'")
        assert result.stdout.count("FORGED") == 2
        assert "junk" in result.stderr
        assert (await interp.run_code("3")).text == "3"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ("os.write(fd, b'\\xff\\xff\\xff\\xffgarbage')", "over the bound"),
        ("os.write(fd, struct.pack('>I', 9) + b'not json!')", "malformed frame"),
        (
            'os.write(fd, struct.pack(\'>I\', 31) + b\'{"t":"result","id":999,"value"\')',
            "malformed frame",
        ),
        ("os.close(fd); import time; time.sleep(30)", "exited|following|ended|killed"),
    ],
    ids=["huge-length", "not-json", "truncated", "closed"],
)
async def test_garbage_on_the_protocol_stream_is_a_crash_report_not_a_result(
    runtime: str | None, python_image: str, engine: Engine, payload: str, reason: str
) -> None:
    """The code finds the protocol's own descriptor (it shares the interpreter's process, so it
    always can) and writes junk to it or closes it: reported, never hung on, never a value."""
    find = "import os, struct, sys\nfd = sys.modules['__main__'].PROTO_FD\n"
    async with open_interpreter(spec(python_image, runtime), engine=engine) as interp:
        t0 = trio.current_time()
        with pytest.raises(InterpreterDied, match=reason):
            await interp.run_code(find + payload, timeout=3)
        # Junk ends it at once; a closed stream at the latest when the call's time limit
        # passes and the interrupted interpreter finds its stream gone.
        assert trio.current_time() - t0 < 3 + INTERRUPT_GRACE_S + 5
        await interp.restart()
        assert (await interp.run_code("'again'")).text == "'again'"


def test_blocking_and_aio_interpreters(python_image: str, witness: Witness) -> None:
    from sbxkit import aio, blocking

    with blocking.open_interpreter(spec(python_image, None)) as interp:
        interp.run_code("n = 5")
        assert interp.run_code("n * 2").text == "10"

    async def main() -> str | None:
        async with aio.open_interpreter(spec(python_image, None)) as held:
            await held.run_code("m = 3")
            return (await held.run_code("m + 1")).text

    import asyncio

    assert asyncio.run(main()) == "4"
