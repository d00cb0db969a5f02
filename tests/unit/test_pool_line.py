"""The pool's claim line (sbxkit/pool/line.py): whatever argv and env a spec carries (newlines
and carriage returns included, env keys named like the splice variables), the parked shell
(``PARK_SCRIPT``, here under the host's dash and busybox ash — the shells of the two test
images) runs exactly that command with exactly that environment, nothing the shell added
itself, and the payload gets the rest of stdin byte-exact. What the line cannot carry exactly
is served cold, never parsed as shell (issue 27, findings 1, 2, 6, 8)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sbxkit.pool.line import MAX_CLAIM_LINE, PARK_SCRIPT, claim_line, claimable_key

SHELLS = {"dash": ["dash", "-c"], "ash": ["busybox", "sh", "-c"]}
WORDS = st.text(  # newlines and carriage returns included: they ride spliced
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40
)
NAMES = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True),
    st.sampled_from(["nl", "cr", "l", "IFS", "PS1", "PS4", "PWD", "OLDPWD", "SHLVL", "PATH"]),
).filter(lambda name: name != "OPTIND" and not name.startswith(("LC_", "LANG")))
REPORT = (
    "import json, os, sys; data = sys.stdin.buffer.read(); "
    "print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ), 'stdin': data.hex()}))"
)
# The container's own, set before the shell starts (a UTF-8 locale: Python adds LC_CTYPE
# to a C locale's environment, PEP 538).
BASE_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}


def parked_run(shell: str, line: bytes, rest: bytes) -> dict[str, object]:
    done = subprocess.run(
        [*SHELLS[shell], PARK_SCRIPT],
        input=line + rest,
        capture_output=True,
        check=True,
        env=BASE_ENV,
        cwd="/",
    )
    report: dict[str, object] = json.loads(done.stdout)
    return report


@pytest.mark.parametrize("shell", SHELLS)
@settings(max_examples=60, deadline=None)
@given(
    args=st.lists(WORDS, max_size=5),
    env=st.dictionaries(NAMES, WORDS, max_size=4),
    rest=st.binary(max_size=300),
)
def test_the_parked_shell_runs_exactly_the_claimed_command(
    shell: str, args: list[str], env: dict[str, str], rest: bytes
) -> None:
    line = claim_line([sys.executable, "-E", "-c", REPORT, *args], env)
    if line is None:  # only the one case the line cannot order (module docstring)
        assert "\r" in env["nl"]
        assert "\n" in env["cr"]
        return
    report = parked_run(shell, line, rest)
    assert report["argv"] == args
    assert report["stdin"] == rest.hex()
    assert report["env"] == {**BASE_ENV, **env}  # nothing more: no PWD, SHLVL of the shell's


@pytest.mark.parametrize("shell", SHELLS)
def test_splice_names_as_env_keys_do_not_change_other_words(shell: str) -> None:
    # Finding 2: --env nl=X --env zz=$'p\nq' with an argv word a\nb gave [aXb] [pXq].
    env = {"nl": "X", "cr": "Y", "zz": "p\nq\rr"}
    line = claim_line([sys.executable, "-E", "-c", REPORT, "a\nb", "c\rd"], env)
    assert line is not None
    report = parked_run(shell, line, b"")
    assert report["argv"] == ["a\nb", "c\rd"]
    assert report["env"] == {**BASE_ENV, **env}


@pytest.mark.parametrize("shell", SHELLS)
def test_the_images_own_values_of_the_shells_keys_are_put_back(shell: str) -> None:
    image_env = {"SHLVL": "7", "PWD": "/srv", "OTHER": "not restored: already there"}
    line = claim_line([sys.executable, "-E", "-c", REPORT], {"PWD": "/spec"}, image_env=image_env)
    assert line is not None
    report = parked_run(shell, line, b"")
    assert report["env"] == {**BASE_ENV, "SHLVL": "7", "PWD": "/spec"}  # the spec's value wins


@pytest.mark.parametrize(
    "key",
    ["A;exec${IFS}echo${IFS}OTHER;B", "A-B", "ÄKEY", "it's", "$(id)", "`id`", "1A", "OPTIND"],
)
def test_a_key_no_shell_can_export_is_served_cold_never_parsed(key: str) -> None:
    # Finding 1: such a key made the parked shell run another command (or exit 2).
    assert not claimable_key(key)
    assert claim_line(["env"], {key: "v"}) is None


def test_what_cannot_be_claimed_is_said() -> None:
    assert claim_line(["echo", "a\nb"], {}) == b'unset PWD OLDPWD SHLVL; exec echo a"$nl"b\n'
    assert claim_line(["echo", "nul\0"], {}) is None
    assert claim_line(["-x"], {}) is None  # exec would take it for an option
    assert claim_line(["echo", "x"], {"K": "it's"}) == (
        b"unset PWD OLDPWD SHLVL; K='it'\"'\"'s' exec echo x\n"
    )


def test_a_line_longer_than_the_cap_is_served_cold() -> None:
    # Finding 6: 7 args of 128,000 quotes took the parked shell 2.6 s to read and parse, all
    # of it counted against the payload's time limit.
    fits = claim_line(["echo", "x" * (MAX_CLAIM_LINE - 100)], {})
    assert fits is not None
    assert claim_line(["echo", "x" * MAX_CLAIM_LINE], {}) is None
    assert claim_line(["echo", *["'" * 128_000] * 7], {}) is None
