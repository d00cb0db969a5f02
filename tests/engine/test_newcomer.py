"""A newcomer's first hour against the real engine (issue 25): the README's first command on a
shared daemon, flags after the image, error messages without internals."""

from __future__ import annotations

import json
import secrets

from tests.engine.helpers import container_exists
from tests.engine.test_cli import SMALL, sbxkit
from tests.witness import LEASE_LABEL, RUN_LABEL, THIS_RUN, Witness


def start_foreign_sandbox(witness: Witness, image: str) -> str:
    """A running container labelled as another user's sbxkit sandbox, made by the witness
    (this session's run label too, so a failure to remove it would still count as a leak)."""
    labels = {LEASE_LABEL: secrets.token_hex(16), RUN_LABEL: THIS_RUN or ""}
    response = witness.session.post(
        f"{witness.base}/containers/create",
        json={"Image": image, "Cmd": ["sleep", "300"], "Labels": labels},
        timeout=30,
    )
    response.raise_for_status()
    container_id: str = response.json()["Id"]
    started = witness.session.post(f"{witness.base}/containers/{container_id}/start", timeout=30)
    started.raise_for_status()
    return container_id


def test_the_demo_counts_only_the_sandboxes_it_created(witness: Witness, busybox: str) -> None:
    foreign = start_foreign_sandbox(witness, busybox)
    try:
        proc = sbxkit("demo", "--socket", witness.socket_path)
        out = proc.stdout.decode()
        assert proc.returncode == 0, out + proc.stderr.decode()
        assert "containers this demo left behind: 0" in out
        assert "every limit held" in out
        assert container_exists(witness, foreign)  # left alone
    finally:
        witness.remove(foreign)


def test_flags_between_the_image_and_the_separator_are_flags(
    witness: Witness, busybox: str
) -> None:
    proc = sbxkit(
        "run", *SMALL, "--socket", witness.socket_path, busybox, "--json", "--", "echo", "hi"
    )
    assert proc.returncode == 0, proc.stderr.decode()
    doc = json.loads(proc.stdout)
    assert (doc["status"], doc["exit_code"], doc["stdout"]) == ("exited", 0, "hi\n")
