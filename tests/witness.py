"""An independent view of the daemon (requests-unixsocket), never the code under test.

Real-engine tests prove what happened — containers left behind, events seen, images present —
through this client, so a bug in sbxkit's own engine client cannot hide a leak.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from typing import Any

import requests_unixsocket

from sbxkit._model.uids import HOST_UIDS, MAPPED_UIDS, UidRange

SOCKET = os.environ.get("SBXKIT_TEST_SOCKET", "/var/run/docker.sock")
BUSYBOX = os.environ.get("SBXKIT_TEST_BUSYBOX_IMAGE", "sbxkit-test/busybox:latest")
PYTHON = os.environ.get("SBXKIT_TEST_PYTHON_IMAGE", "sbxkit-test/python:latest")
PYDATA = os.environ.get("SBXKIT_TEST_PYDATA_IMAGE", "sbxkit-test/pydata:latest")
"""The python image with numpy, pandas and matplotlib (scripts/engine-up, from wheels)."""
EVENTS_MARGIN_S = 2.0
"""How much earlier than a window the daemon is asked for its events (``Witness.events``)."""
LEASE_LABEL = "sbxkit.lease"
RUN_LABEL = "sbxkit-test.run"
THIS_RUN = dict(
    item.partition("=")[::2] for item in os.environ.get("SBXKIT_LABELS", "").split(",") if item
).get(RUN_LABEL)
"""This test session's run label (tests/conftest.py sets it through SBXKIT_LABELS)."""


class Witness:
    def __init__(self, socket_path: str = SOCKET) -> None:
        self.socket_path = socket_path
        self.base = "http+unix://" + urllib.parse.quote(socket_path, safe="")
        self.session = requests_unixsocket.Session()

    def get(self, path: str, **params: Any) -> Any:
        response = self.session.get(self.base + path, params=params, timeout=30)
        response.raise_for_status()
        return response.json()

    def ping(self) -> bool:
        try:
            return self.session.get(self.base + "/_ping", timeout=5).text == "OK"
        except Exception:
            return False

    def is_podman(self) -> bool:
        """A Podman API service answers /_ping with a Libpod-Api-Version header."""
        response = self.session.get(self.base + "/_ping", timeout=5)
        return "Libpod-Api-Version" in response.headers

    def maps_uids(self) -> bool:
        """The daemon maps container uids to subordinate host ids (``userns-remap``, rootless),
        as its own ``/info`` says (Podman's ``/libpod/info``)."""
        if self.is_podman():  # its compat /info does not say rootless: /libpod/info does
            return bool(self.get("/v4.0.0/libpod/info")["host"]["security"]["rootless"])
        return bool(self._docker_remappings())

    def is_rootless_docker(self) -> bool:
        """A Docker daemon whose ``/info`` says it runs rootless."""
        return not self.is_podman() and "rootless" in self._docker_remappings()

    def _docker_remappings(self) -> set[str]:
        """Which of ``userns`` and ``rootless`` a Docker daemon's ``/info`` ``SecurityOptions``
        name."""
        options = self.get("/info").get("SecurityOptions") or []
        kinds = ("userns", "rootless")
        return {kind for kind in kinds for item in options if f"name={kind}" in item}

    def sandbox_uids(self) -> UidRange:
        """Where a sandbox that names no user gets its uid on this daemon (sbxkit._model.uids)."""
        return MAPPED_UIDS if self.maps_uids() else HOST_UIDS

    def image_exists(self, name: str) -> bool:
        return self.session.get(f"{self.base}/images/{name}/json", timeout=30).status_code == 200

    def containers(self, label: str | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"all": "1"}
        if label:
            params["filters"] = json.dumps({"label": [label]})
        result: list[dict[str, Any]] = self.get("/containers/json", **params)
        return result

    def sbxkit_containers(self) -> list[dict[str, Any]]:
        """Every container sbxkit could own — by lease label or by our name prefix — except
        those of *another* test session on a shared daemon (another ``sbxkit-test.run``
        value). A container without a run label counts as ours: leaks are never excused."""
        return [
            c
            for c in self.containers()
            if (
                LEASE_LABEL in (c.get("Labels") or {})
                or any(n.lstrip("/").startswith("sbxkit-") for n in c.get("Names") or [])
            )
            and (c.get("Labels") or {}).get(RUN_LABEL, THIS_RUN) == THIS_RUN
        ]

    def wait_until_no_sbxkit_containers(self, seconds: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + seconds
        while True:
            left = self.sbxkit_containers()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.05)

    def events(self, since: float, until: float, **filters: list[str]) -> list[dict[str, Any]]:
        """Daemon events in [since, until] (unix seconds) matching the filters.

        The daemon is asked from ``EVENTS_MARGIN_S`` earlier and the window is cut here, on
        each event's ``timeNano``: it walks its buffer from the newest back and stops at the
        first event older than ``since``, and two events logged at once can be stored out of
        their timestamps' order, so an event just inside the window could be skipped."""
        params = {"since": f"{since - EVENTS_MARGIN_S:.9f}", "until": f"{until:.9f}"}
        if filters:
            params["filters"] = json.dumps(filters)
        response = self.session.get(self.base + "/events", params=params, timeout=30)
        response.raise_for_status()
        found = [json.loads(line) for line in response.text.splitlines() if line.strip()]
        low, high = int(since * 1e9), int(until * 1e9)
        return [e for e in found if low <= int(e.get("timeNano", e.get("time", 0) * 10**9)) <= high]

    def remove(self, container_id: str) -> None:
        self.session.delete(
            f"{self.base}/containers/{container_id}", params={"force": "1", "v": "1"}, timeout=30
        )

    def kill(self, container_id: str, signal: str = "KILL") -> None:
        """An operator's ``docker kill``, through the daemon's API."""
        response = self.session.post(
            f"{self.base}/containers/{container_id}/kill", params={"signal": signal}, timeout=30
        )
        response.raise_for_status()
