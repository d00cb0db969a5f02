"""Benchmark ``openai_agents``: the OpenAI Agents SDK's time to its first command, on its own
Docker backend and on sbxkit (needs ``.[openai-agents]`` and docker-py, ``.[bench]``).

    python -m bench.openai_agents --rounds 8

Contenders, interleaved round-robin in one asyncio program on the same daemon and image:

``docker``
    ``DockerSandboxClient(docker.from_env())`` with ``DockerSandboxClientOptions(image=...)``:
    the SDK's default backend (no limits, the image's user, Docker's default network).
``sbxkit``
    ``SbxkitSandboxClient()`` with ``SbxkitSandboxClientOptions(image=...)``: the hardened
    body, every limit, the supervisor's lease.

Each round: ``client.create`` → ``session.start()`` → ``session.exec("true")`` (the time to the
first command), then ``session.aclose()`` + ``client.delete`` until the daemon no longer lists
the container (the time to gone). Medians and their ratio are printed and written to
bench/results/openai_agents.md; a leaked container is exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import docker
from agents.sandbox import Manifest
from agents.sandbox.sandboxes.docker import DockerSandboxClient, DockerSandboxClientOptions

from bench.suite import default_socket
from sbxkit.integrations.openai_agents import SbxkitSandboxClient, SbxkitSandboxClientOptions

IMAGE = os.environ.get("SBXKIT_TEST_PYTHON_IMAGE", "sbxkit-test/python:latest")
RESULTS = Path(__file__).parent / "results" / "openai_agents.md"
LABEL = "sbxkit-bench.openai-agents"

Round = Callable[[], Awaitable[tuple[float, float]]]


def contenders(run: str) -> dict[str, Round]:
    api = docker.DockerClient(base_url=f"unix://{default_socket()}")
    labels = {LABEL: run}

    async def one(client: Any, options: Any) -> tuple[float, float]:
        started = time.perf_counter()
        session = await client.create(manifest=Manifest(), options=options)
        await session.start()
        result = await session.exec("true")
        first = time.perf_counter() - started
        assert result.exit_code == 0, result.stderr
        closing = time.perf_counter()
        await session.aclose()
        await client.delete(session)
        while ours(api, run):  # noqa: ASYNC110 - polling the daemon is the measure
            await asyncio.sleep(0.02)
        return first, time.perf_counter() - closing

    async def on_docker() -> tuple[float, float]:
        options = DockerSandboxClientOptions(image=IMAGE, labels=labels)
        return await one(DockerSandboxClient(api), options)

    async def on_sbxkit() -> tuple[float, float]:
        options = SbxkitSandboxClientOptions(image=IMAGE, labels=labels)
        return await one(SbxkitSandboxClient(), options)

    return {"docker": on_docker, "sbxkit": on_sbxkit}


def ours(api: Any, run: str) -> list[Any]:
    return list(api.containers.list(all=True, filters={"label": f"{LABEL}={run}"}))


async def measure(rounds: int) -> dict[str, list[tuple[float, float]]]:
    run = uuid.uuid4().hex[:12]
    chosen = contenders(run)
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in chosen}
    await chosen["sbxkit"]()  # warm both (the supervisor's start, the image's pages)
    await chosen["docker"]()
    for _ in range(rounds):
        for name, contender in chosen.items():
            found[name].append(await contender())
    return found


def report(found: dict[str, list[tuple[float, float]]], rounds: int) -> str:
    def median(name: str, index: int) -> float:
        return statistics.median(pair[index] for pair in found[name])

    first = {name: median(name, 0) for name in found}
    gone = {name: median(name, 1) for name in found}
    lines = [
        "# openai_agents: the OpenAI Agents SDK's first command, Docker backend vs sbxkit",
        "",
        f"`python -m bench.openai_agents --rounds {rounds}` (image `{IMAGE}`, daemon "
        f"`{default_socket()}`), medians of {rounds} interleaved rounds:",
        "",
        "| contender | create → first `exec` returns | `aclose` + `delete` → container gone |",
        "|---|---:|---:|",
    ]
    for name in found:
        lines.append(f"| {name} | {first[name] * 1000:.0f} ms | {gone[name] * 1000:.0f} ms |")
    lines += [
        "",
        f"time to the first command, sbxkit / docker: **{first['sbxkit'] / first['docker']:.2f}**",
        f"time to gone, sbxkit / docker: {gone['sbxkit'] / gone['docker']:.2f}",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.openai_agents")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args(argv)
    found = asyncio.run(measure(args.rounds))
    text = report(found, args.rounds)
    print(text)
    RESULTS.write_text(text)
    api = docker.DockerClient(base_url=f"unix://{default_socket()}")
    left = api.containers.list(all=True, filters={"label": LABEL})
    if left:
        print(f"leaked: {[c.id[:12] for c in left]}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
