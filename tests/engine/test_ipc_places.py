"""The writable places outside /tmp that Docker gives every container: /dev/shm and /dev/mqueue.

/dev/shm is bounded by ``Limits.shm_bytes`` (HostConfig.ShmSize); /dev/mqueue holds no queue at
all (RLIMIT_MSGQUEUE 0; gVisor has no /dev/mqueue). Both are proven from inside the sandbox, with
a positive control next to each refusal, on the cold and the pooled path.
"""

from __future__ import annotations

from sbxkit.engine.client import Engine
from sbxkit.spec import MiB
from tests.engine.helpers import spec, text
from tests.engine.oneshot_paths import OneShot


async def test_dev_shm_is_writable_up_to_shm_bytes_and_no_further(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    script = (
        "dd if=/dev/zero of=/dev/shm/half bs=64k count=8 && echo half=ok; "
        "wc -c < /dev/shm/half; rm -f /dev/shm/half; "
        "dd if=/dev/zero of=/dev/shm/double bs=64k count=32; echo double=$?"
    )
    result = await oneshot(spec(busybox, script, shm_bytes=MiB, runtime=runtime), engine=engine)

    assert result.status == "exited", result
    lines = text(result.stdout).split()
    assert "half=ok" in lines  # the positive control: /dev/shm is there and writable
    assert str(512 * 1024) in lines
    assert "double=0" not in lines
    assert any(line.startswith("double=") for line in lines), lines
    assert "No space left" in text(result.stderr)


async def test_no_message_queue_can_be_created_in_dev_mqueue(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    # Creating a file in /dev/mqueue is mq_open(O_CREAT); without the limit it succeeds.
    script = (
        "(: > /tmp/control) && echo control=ok; "
        "(: > /dev/mqueue/q); echo create=$?; ls -A /dev/mqueue 2>/dev/null | wc -l"
    )
    result = await oneshot(spec(busybox, script, runtime=runtime), engine=engine)

    assert result.status == "exited", result
    lines = text(result.stdout).split()
    assert "control=ok" in lines
    assert "create=0" not in lines, result
    assert lines[-1] == "0", lines  # no queue exists
