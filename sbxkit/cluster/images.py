"""An image's content, comparable across hosts: its layers and run configuration.

Image IDs are no use across hosts: an image imported or built on each host separately gets a
different ID (the config carries its creation time) with the same layers. Two hosts run the
same thing when the image's layer digests (``RootFS.Layers``: the uncompressed content) and the
configuration a container starts from are the same; ``content_fingerprint`` hashes exactly
those.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from sbxkit.engine.client import Engine
from sbxkit.engine.models import Reply
from sbxkit.engine.transport import api_path
from sbxkit.errors import NotFound

RUN_CONFIG = ("Entrypoint", "Cmd", "Env", "User", "WorkingDir", "Volumes", "Shell", "StopSignal")
"""The image configuration a container starts from (labels, history and dates are not)."""


class _RootFS(Reply):
    layers: list[str] = msgspec.field(default_factory=list)


class _ImageContent(Reply):
    id: str
    root_fs: _RootFS = msgspec.field(default_factory=_RootFS, name="RootFS")
    config: dict[str, Any] | None = None


def content_fingerprint(layers: Iterable[str], config: Mapping[str, Any] | None) -> str:
    """sha256 over the layer digests and the run configuration (pure)."""
    run_config = {key: (config or {}).get(key) for key in RUN_CONFIG}
    document = msgspec.json.encode({"layers": list(layers), "config": run_config}, order="sorted")
    return "sha256:" + hashlib.sha256(document).hexdigest()


async def image_fingerprints(engine: Engine, names: Iterable[str]) -> dict[str, str | None]:
    """Each named image's content fingerprint on ``engine`` (None: the image is missing)."""
    found: dict[str, str | None] = {}
    for name in sorted(set(names)):
        try:
            content = await engine.call_json(
                "GET",
                api_path("/images/{}/json", name),
                _ImageContent,
                timeout=engine.deadlines.inspect,
            )
        except NotFound:
            found[name] = None
            continue
        found[name] = content_fingerprint(content.root_fs.layers, content.config)
    return found
