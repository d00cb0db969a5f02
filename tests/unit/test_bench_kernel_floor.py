"""bench pool's ``raw_kernel`` contender sends sbxkit's own kernel path body
(bench/kernel_floor.py): what the product would send for the bench's spec, but labelled as the
bench's alone, so no supervisor takes it for a lease of its own."""

from __future__ import annotations

from pathlib import Path

import msgspec

from bench.kernel_floor import kernel_floor_body
from bench.pool import true_spec
from sbxkit._kernel.scripts import IO_TARGET, io_bind, kernel_io
from sbxkit._model.spec import LEASE_LABEL
from sbxkit._plan.policy import build_create_body

LEASE = "0123456789abcdef0123456789abcdef"


def test_the_body_is_the_products_kernel_path_body_but_for_its_labels(tmp_path: Path) -> None:
    spec = true_spec("busybox:bench")
    io_dir = tmp_path / LEASE

    body = kernel_floor_body(spec, LEASE, io_dir)

    product, _ = kernel_io(build_create_body(spec, LEASE), str(io_dir), {})
    expected = msgspec.to_builtins(product)
    assert LEASE_LABEL in expected["Labels"]
    assert body["Labels"] == dict(spec.labels)
    assert {k: v for k, v in body.items() if k != "Labels"} == {
        k: v for k, v in expected.items() if k != "Labels"
    }
    assert io_bind(str(io_dir)) in body["HostConfig"]["Binds"]
    assert body["Cmd"][:2] == ["sh", "-c"]
    assert IO_TARGET in body["Cmd"][2]
    assert body["Cmd"][-1] == "true"
    assert body["HostConfig"]["Memory"] == spec.limits.memory_bytes
