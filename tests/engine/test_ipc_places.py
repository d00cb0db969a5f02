"""The writable places outside /tmp that Docker gives every container: /dev/shm and /dev/mqueue.

/dev/shm is bounded by ``Limits.shm_bytes`` (HostConfig.ShmSize); /dev/mqueue holds no queue at
all (RLIMIT_MSGQUEUE 0; gVisor has no /dev/mqueue). Both are proven from inside the sandbox, with
a positive control next to each refusal, on the cold and the pooled path.
"""

from __future__ import annotations

from sbxkit._model.spec import MiB
from sbxkit.engine.client import Engine
from tests.engine.helpers import (
    assert_half_fits_double_does_not,
    fill_half_then_double,
    spec,
    text,
)
from tests.engine.oneshot_paths import OneShot


async def test_dev_shm_is_writable_up_to_shm_bytes_and_no_further(
    oneshot: OneShot, runtime: str | None, engine: Engine, busybox: str
) -> None:
    script = fill_half_then_double("/dev/shm")
    result = await oneshot(spec(busybox, script, shm_bytes=MiB, runtime=runtime), engine=engine)
    assert_half_fits_double_does_not(result)


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
