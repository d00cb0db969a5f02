"""Engine API calls for networks: inspect, create, remove (the managed network's endpoints).

Functions over an ``Engine``'s public call surface, like ``execapi``; they know nothing of
sandboxes.
"""

from __future__ import annotations

import msgspec

from sbxkit.engine.client import Engine
from sbxkit.engine.models import Body, Reply
from sbxkit.engine.transport import api_path

__all__ = ["NetworkCreate", "NetworkReply", "network_create", "network_inspect", "network_remove"]


class IpamConfigReply(Reply):
    subnet: str = ""
    gateway: str = ""


class IpamReply(Reply):
    driver: str = ""
    config: list[IpamConfigReply] | None = None


class NetworkReply(Reply):
    name: str = ""
    id: str = ""
    driver: str = ""
    internal: bool = False
    attachable: bool = False
    labels: dict[str, str] | None = None
    ipam: IpamReply = msgspec.field(default_factory=IpamReply, name="IPAM")


class NetworkCreate(Body):
    name: str
    driver: str
    attachable: bool
    check_duplicate: bool
    labels: dict[str, str]


async def network_inspect(engine: Engine, name: str) -> NetworkReply:
    path = api_path("/networks/{}", name)
    return await engine.call_json("GET", path, NetworkReply, timeout=engine.deadlines.inspect)


async def network_create(engine: Engine, body: NetworkCreate) -> None:
    """Create a network (a 409 — it exists — is the daemon's, raised as ``Conflict``)."""
    await engine.call(
        "POST",
        api_path("/networks/create"),
        body=msgspec.json.encode(body),
        timeout=engine.deadlines.create,
    )


async def network_remove(engine: Engine, name: str) -> None:
    await engine.call("DELETE", api_path("/networks/{}", name), timeout=engine.deadlines.remove)
