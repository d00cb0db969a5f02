"""The pool's claim line (sbxkit/pool/line.py): whatever argv and env a spec carries (newlines and
carriage returns included), the parked shell (``PARK_SCRIPT``, here under the host's dash)
runs exactly that command with exactly that environment, and the payload gets the rest of
stdin byte-exact."""

from __future__ import annotations

import json
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from sbxkit.pool import PARK_SCRIPT, claim_line

WORDS = st.text(  # newlines and carriage returns included: they ride spliced
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40
)
NAMES = st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True).filter(
    lambda name: name not in {"PWD", "OLDPWD", "SHLVL", "IFS", "PS1", "PS2", "PS4", "OPTIND"}
)
REPORT = (
    "import json, os, sys; data = sys.stdin.buffer.read(); "
    "print(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ), 'stdin': data.hex()}))"
)


@settings(max_examples=60, deadline=None)
@given(
    args=st.lists(WORDS, max_size=5),
    env=st.dictionaries(NAMES, WORDS, max_size=4),
    rest=st.binary(max_size=300),
)
def test_the_parked_shell_runs_exactly_the_claimed_command(
    args: list[str], env: dict[str, str], rest: bytes
) -> None:
    line = claim_line([sys.executable, "-c", REPORT, *args], env)
    assert line is not None
    done = subprocess.run(
        ["sh", "-c", PARK_SCRIPT], input=line + rest, capture_output=True, check=True, env={}
    )
    report = json.loads(done.stdout)
    assert report["argv"] == args
    assert report["stdin"] == rest.hex()
    for key, value in env.items():
        assert report["env"][key] == value


def test_what_cannot_be_claimed_is_said() -> None:
    assert claim_line(["echo", "a\nb"], {}) == b'exec echo a"$nl"b\n'
    assert claim_line(["echo", "nul\0"], {}) is None
    assert claim_line(["-x"], {}) is None  # exec would take it for an option
    assert claim_line(["echo", "x"], {"K": "it's"}) == b"export K='it'\"'\"'s'; exec echo x\n"
