"""What a claim line carries, on the real engine (issue 27, findings 1, 2, 6, 7, 8): a pooled
run's command and environment are the cold run's exactly, and what a claim line cannot carry
exactly is served cold with the cold run's result — never parsed as shell."""

from __future__ import annotations

import pytest

from sbxkit._consumers.runner import run as cold_run
from sbxkit.errors import SpecError
from sbxkit.pool.line import MAX_CLAIM_LINE
from tests.engine.helpers import python_spec, spec
from tests.engine.oneshot_paths import PATHS, OneShot
from tests.witness import Witness

VARYING = ("HOSTNAME=", "SBXKIT_LEASE=")  # each container's own


def env_lines(stdout: bytes) -> list[str]:
    return sorted(line for line in stdout.decode().splitlines() if not line.startswith(VARYING))


@pytest.mark.parametrize("image_name", ["busybox", "python"])
async def test_a_pooled_payload_sees_the_cold_runs_environment(
    oneshot: OneShot, image_name: str, busybox: str, python_image: str
) -> None:
    # Finding 8: dash added PWD=/, busybox SHLVL and PWD, to the pooled run's environment.
    image = busybox if image_name == "busybox" else python_image
    s = spec(image, "unused", env={"K": "v", "nl": "X", "PATH": "/bin:/usr/bin"})
    s.command[:] = ["env"]  # no shell of the payload's own: it would add PWD itself
    cold = await cold_run(s)
    result = await oneshot(s)
    assert result.status == "exited", result.stderr
    assert env_lines(result.stdout) == env_lines(cold.stdout)
    assert "PWD=/" not in env_lines(result.stdout)


async def test_splice_names_as_env_keys_change_no_other_word(
    oneshot: OneShot, busybox: str
) -> None:
    # Finding 2: --env nl=X --env zz=$'p\nq' with the word a\nb gave [aXb] [pXq] pooled.
    script = 'printf "[%s] [%s] [%s]" "$1" "$zz" "$nl"'
    s = spec(busybox, script, env={"nl": "X", "cr": "Y", "zz": "p\nq"})
    s.command.extend(["-", "a\nb"])
    result = await oneshot(s)
    assert result.stdout == b"[a\nb] [p\nq] [X]"


KEYS = ["A;exec${IFS}echo${IFS}OTHER;B", "A-B", "ÄKEY", "it's", "$(id)", "`id`"]


@pytest.mark.parametrize("path", ["cold", "pooled", "held"])
async def test_keys_no_shell_can_export_are_served_cold_with_the_cold_result(
    path: str, busybox: str
) -> None:
    # Finding 1: such a key made the held path run another command (stdout OTHER), ran code
    # ($(...), backticks) or ended with exit 2.
    s = spec(busybox, "unused", env={key: f"value {i}" for i, key in enumerate(KEYS)})
    s.command[:] = ["env"]
    options = {} if path == "cold" else {"served_cold": True}
    result = await PATHS[path](s, **options)
    assert (result.status, result.exit_code) == ("exited", 0), result.stderr
    assert result.evidence == "daemon"  # a shell would drop these keys: no FIFO wrapper
    lines = env_lines(result.stdout)
    for i, key in enumerate(KEYS):
        assert f"{key}=value {i}" in lines
    assert "OTHER" not in lines  # the injected echo's own line
    assert "uid=" not in result.stdout.decode()


@pytest.mark.parametrize("path", ["pooled", "held"])
async def test_a_command_too_long_for_a_claim_line_runs_cold_on_its_own_time(
    path: str, python_image: str
) -> None:
    # Finding 6: 7 args of 128,000 quotes, timeout 3 s: cold exited in 0.07 s, held was
    # timed_out at 3 s (the parked shell read and parsed a 4.5 MB line).
    s = python_spec(python_image, "import sys; print(len(sys.argv))", *["'" * 128_000] * 7)
    s.limits.timeout_s = 3.0
    result = await PATHS[path](s, served_cold=True)
    assert (result.status, result.stdout) == ("exited", b"8\n")
    assert len(" ".join(s.command)) > MAX_CLAIM_LINE


@pytest.mark.parametrize("path", list(PATHS))
async def test_a_command_over_the_limit_is_refused_naming_it_on_every_path(
    path: str, busybox: str, witness: Witness
) -> None:
    # Finding 7: 15 args of 128,000 bytes failed cold with "WireError: message of 1921322
    # bytes exceeds the 1048576-byte cap" at run time; the held path ran it.
    s = spec(busybox, "true")
    s.command.extend(["x" * 128_000] * 15)
    with pytest.raises(SpecError) as refused:
        await PATHS[path](s)
    assert refused.value.field == "command"
    assert witness.sbxkit_containers() == []
