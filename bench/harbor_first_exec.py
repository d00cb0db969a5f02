"""Time to first exec of a Harbor environment: sbxkit's against a Docker CLI baseline.

``python -m bench.harbor_first_exec [--rounds N] [--image IMAGE]``, in a Python 3.12 venv with
``sbxkit[harbor]`` (not registered in ``python -m bench``: Harbor does not import on 3.11).

Contenders, interleaved round by round against the same daemon (``$DOCKER_HOST``):

``sbxkit``
    ``SbxkitEnvironment.start()`` then ``exec("true")``, as a Harbor trial calls them: the
    image check, the workspace's root proven with the daemon, the supervisor's lease, create,
    inspect, start, the output dirs made, then the first command (through ``bash -c``).
``docker_cli``
    What Harbor's default ``docker`` environment runs under ``docker compose``: ``docker run -d
    --network none IMAGE sleep infinity`` then ``docker exec ID bash -c true`` — the baseline
    without compose's own overhead (no ``docker compose`` on the test host), so the ratio is
    an upper bound of sbxkit's cost against the real default.

Each round's removal (``stop``; ``docker rm -f``) is outside the timed span. Prints the
medians and the ratio sbxkit / docker_cli; measures, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from sbxkit.integrations.harbor import SbxkitEnvironment


async def sbxkit_once(image: str, where: Path, index: int) -> float:
    trial = TrialPaths(where / f"trial-{index}")
    trial.mkdir()
    environment_dir = where / "environment"
    environment_dir.mkdir(exist_ok=True)
    config = EnvironmentConfig(docker_image=image, storage_mb=512)
    env = SbxkitEnvironment(
        environment_dir=environment_dir,
        environment_name="bench",
        session_id=f"bench__{index}__env",
        trial_paths=trial,
        task_env_config=config,
        network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
    )
    started = time.perf_counter()
    try:
        await env.start(force_build=False)
        result = await env.exec("true")
        elapsed = time.perf_counter() - started
    finally:
        await env.stop(delete=True)
    assert result.return_code == 0, result
    return elapsed


async def docker(*argv: str) -> str:
    process = await asyncio.create_subprocess_exec(
        "docker", *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"docker {' '.join(argv)}: {err.decode()}")
    return out.decode().strip()


async def docker_once(image: str) -> float:
    started = time.perf_counter()
    container = await docker("run", "-d", "--network", "none", image, "sleep", "infinity")
    try:
        await docker("exec", container, "bash", "-c", "true")
        elapsed = time.perf_counter() - started
    finally:
        await docker("rm", "-f", container)
    return elapsed


async def main(rounds: int, image: str) -> None:
    times: dict[str, list[float]] = {"sbxkit": [], "docker_cli": []}
    with tempfile.TemporaryDirectory(prefix="sbxkit-bench-harbor-") as scratch:
        for index in range(rounds + 1):  # round 0 warms both up and is not counted
            order = ["sbxkit", "docker_cli"] if index % 2 else ["docker_cli", "sbxkit"]
            for name in order:
                if name == "sbxkit":
                    elapsed = await sbxkit_once(image, Path(scratch), index)
                else:
                    elapsed = await docker_once(image)
                if index:
                    times[name].append(elapsed)
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, values in times.items():
        print(
            f"{name:>10}: median {medians[name] * 1000:.0f} ms "
            f"(min {min(values) * 1000:.0f}, max {max(values) * 1000:.0f}, n={len(values)})"
        )
    print(f"ratio sbxkit / docker_cli: {medians['sbxkit'] / medians['docker_cli']:.2f}")
    print(f"daemon: {os.environ.get('DOCKER_HOST', '(default)')}, image: {image}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--image", default="sbxkit-test/python:latest")
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.image))
