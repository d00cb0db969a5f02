"""The witness counts only this test session's containers on a shared daemon.

Another session's sbxkit containers carry another ``sbxkit-test.run`` label and are never
counted or removed; a sbxkit container with no run label at all still counts (a leak is never
excused by a missing label); this session's own runs carry its label.
"""

from __future__ import annotations

import secrets

import trio

from sbxkit._consumers.runner import run
from sbxkit.engine.client import Engine
from tests.engine.helpers import spec
from tests.witness import LEASE_LABEL, RUN_LABEL, THIS_RUN, Witness


def create_leased(witness: Witness, image: str, labels: dict[str, str]) -> str:
    lease = secrets.token_hex(16)
    response = witness.session.post(
        f"{witness.base}/containers/create",
        params={"name": f"sbxkit-{lease}"},
        json={"Image": image, "Cmd": ["true"], "Labels": {LEASE_LABEL: lease, **labels}},
        timeout=30,
    )
    response.raise_for_status()
    container_id: str = response.json()["Id"]
    return container_id


def test_another_sessions_containers_are_not_ours_and_unlabelled_ones_are(
    witness: Witness, busybox: str
) -> None:
    assert THIS_RUN  # tests/conftest.py gave this session a run label
    foreign = create_leased(witness, busybox, {RUN_LABEL: "another-session"})
    unlabelled = create_leased(witness, busybox, {})
    try:
        ours = {c["Id"] for c in witness.sbxkit_containers()}
        assert foreign not in ours
        assert unlabelled in ours
    finally:
        witness.remove(foreign)
        witness.remove(unlabelled)


async def test_this_sessions_runs_carry_its_run_label(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    seen: list[dict[str, str]] = []

    async def look() -> None:
        for _ in range(200):
            for c in await trio.to_thread.run_sync(witness.sbxkit_containers):
                seen.append(c.get("Labels") or {})
                return
            await trio.sleep(0.02)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(look)
        result = await run(spec(busybox, "sleep 1"), engine=engine)
    assert result.ok
    assert seen
    assert seen[0].get(RUN_LABEL) == THIS_RUN
