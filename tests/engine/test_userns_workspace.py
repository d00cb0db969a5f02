"""The userns cell's workspace checks: on ``dockerd --userns-remap=default`` storing on btrfs
(scripts/userns-engine-up), root inside under plain runc installs a local ``.deb`` with
``apt-get`` on the image's own filesystem, and the disk bound is the kernel's quota: a write
past it fails (``EDQUOT``) while the sandbox runs on, its status its own. The supervisor's watch
(overlay2) is tests/engine/test_workspace_disk.py's, on the main daemon."""

from __future__ import annotations

from pathlib import Path

import pytest

from sbxkit._consumers.session import open_sandbox
from sbxkit._model.spec import MiB
from sbxkit.engine.client import Engine
from tests.engine.helpers import text
from tests.engine.test_workspace_disk import install_and_run, quota_driver, writable
from tests.witness import Witness

pytestmark = pytest.mark.userns


async def test_root_inside_installs_a_local_deb_under_runc(
    engine: Engine, witness: Witness, python_image: str, tmp_path: Path
) -> None:
    await install_and_run(engine, witness, python_image, tmp_path, None)


async def test_the_kernels_quota_holds_a_roots_writes_to_the_bound(
    engine: Engine, witness: Witness, python_image: str
) -> None:
    """64 MiB asked: 32 MiB fit, 64 more fail with the quota's error and what was written
    stays. btrfs counts the image by the blocks it takes, a few percent over its size, so the
    payload gets a little less than the bound — never more. The container's storage size is
    the image's plus the bound."""
    assert quota_driver(witness), "the userns cell's daemon stores on btrfs"
    spec = writable(python_image, "unused", disk=64 * MiB, root=True)
    async with open_sandbox(spec, engine=engine) as sandbox:
        info = witness.get(f"/containers/{sandbox.container_id}/json")
        image = witness.get(f"/images/{info['Image']}/json")
        fits = await sandbox.exec(["sh", "-c", "head -c 32M /dev/zero > /usr/fits && echo ok"])
        past = await sandbox.exec(
            ["sh", "-c", "dd if=/dev/zero of=/usr/past bs=1M count=64; sync; echo dd=$?"]
        )
        sizes = await sandbox.exec(["sh", "-c", "wc -c < /usr/fits; wc -c < /usr/past"])
    assert info["HostConfig"]["StorageOpt"] == {"size": str(image["Size"] + 64 * MiB)}
    assert info["HostConfig"]["ReadonlyRootfs"] is False
    assert text(fits.stdout) == "ok\n", fits
    assert past.status == "exited", past
    assert "Disk quota exceeded" in text(past.stderr), past
    kept, partial = map(int, text(sizes.stdout).split())
    assert kept == 32 * MiB
    assert 16 * MiB <= kept + partial <= 64 * MiB, (kept, partial)
    assert not witness.sbxkit_containers()
