#!/usr/bin/env python3
"""A scripted stand-in for Docker's ``sbx`` CLI, for tests (the real one exists neither in CI
nor on the development machines). Standard library only; one process per invocation.

State lives in the directory named by ``FAKE_SBX_STATE`` (the "machine": every runner
instance of a test shares it):

- ``log.jsonl``: one line per invocation — ``{"argv": [...], "stdin": "...", "environ": {...},
  "pid": N}`` (stdin decoded as UTF-8 with backslash escapes; ``environ`` is this process's
  own environment), so tests can check what crossed which channel.
- ``sandboxes/<name>.json``: one file per sandbox (agent, template, workspace, kits, rules).
- ``sandboxes/<name>.pids``: process-group ids of its execs, killed by ``rm``.
- ``control.json`` (written by tests, optional): ``{"fail_create": "before"|"after",
  "fail_rm": true, "ls_banner": "text", "ls_shape": "list"|"object"|"table"}``.

Commands, minimally and strictly (an unknown flag is an error, so a runner that starts passing
``-e KEY=VALUE`` fails loudly):

- ``create AGENT [--name N] [--template T|-t T] [--kit K]... [-m M|--memory M] [--cpus C]
  PATH``: PATH must be an existing directory. ``fail_create=before`` fails without creating,
  ``after`` records the sandbox and then fails (a half-made VM).
- ``exec [-i] [--] NAME CMD...``: runs CMD **on this host** (no VM here), in its own session,
  cwd the workspace, with all of stdin; output and exit status are CMD's own (128+N for
  signal N, as docker exec).
- ``policy allow network --sandbox NAME RESOURCES``: records the rule on the sandbox.
- ``rm [--force|-f] NAME...``: kills the sandbox's exec process groups, deletes it; unknown
  names fail. ``fail_rm`` fails without removing anything.
- ``ls [--json] [-q]``: the sandboxes, optionally after a banner.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

STATE = Path(os.environ.get("FAKE_SBX_STATE", ""))


def die(message: str, code: int = 1) -> NoReturn:
    sys.stderr.write(f"fake sbx: {message}\n")
    sys.exit(code)


def control() -> dict[str, Any]:
    path = STATE / "control.json"
    if not path.exists():
        return {}
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def log(argv: list[str], stdin: bytes) -> None:
    line = json.dumps(
        {
            "argv": argv,
            "stdin": stdin.decode("utf-8", "backslashreplace"),
            "environ": dict(os.environ),
            "pid": os.getpid(),
        }
    )
    with open(STATE / "log.jsonl", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(line + "\n")


def boxes() -> Path:
    path = STATE / "sandboxes"
    path.mkdir(exist_ok=True)
    return path


def record(name: str) -> dict[str, Any]:
    path = boxes() / f"{name}.json"
    if not path.exists():
        die(f"no sandbox named {name!r}")
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def create(args: list[str]) -> None:
    if not args:
        die("create: AGENT is required", 2)
    agent, rest = args[0], args[1:]
    options: dict[str, Any] = {"kits": []}
    paths: list[str] = []
    while rest:
        arg = rest.pop(0)
        if arg in ("--name", "--template", "-t", "--kit", "-m", "--memory", "--cpus"):
            if not rest:
                die(f"create: {arg} needs a value", 2)
            value = rest.pop(0)
            if arg == "--kit":
                options["kits"].append(value)
            else:
                options[{"-t": "template", "-m": "memory"}.get(arg, arg.lstrip("-"))] = value
        elif arg.startswith("-"):
            die(f"create: unknown flag {arg}", 2)
        else:
            paths.append(arg)
    if len(paths) != 1 or not os.path.isdir(paths[0]):
        die(f"create: exactly one existing workspace directory is required, got {paths}", 2)
    name = options.get("name") or f"{agent}-{os.path.basename(paths[0])}"
    mode = control().get("fail_create")
    if mode == "before":
        die("create: the VM could not be started (scripted failure)")
    sandbox = {"name": name, "agent": agent, "workspace": paths[0], "rules": [], **options}
    try:
        fd = os.open(boxes() / f"{name}.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        die(f"create: a sandbox named {name!r} already exists")
    with os.fdopen(fd, "w") as handle:
        json.dump(sandbox, handle)
    if mode == "after":
        die("create: the VM failed to boot (scripted failure, sandbox left behind)")
    print(f"Created sandbox {name}")


def exec_(args: list[str], stdin: bytes) -> NoReturn:
    while args and args[0].startswith("-"):
        flag = args.pop(0)
        if flag == "--":
            break
        if flag not in ("-i", "--interactive"):
            die(f"exec: unsupported flag {flag}", 2)
    if len(args) < 2:
        die("exec: SANDBOX and COMMAND are required", 2)
    name, command = args[0], args[1:]
    sandbox = record(name)
    try:
        child = subprocess.Popen(
            command, stdin=subprocess.PIPE, cwd=sandbox["workspace"], start_new_session=True
        )
    except OSError as error:
        die(f"exec: {error}", 126)
    with open(boxes() / f"{name}.pids", "a") as handle:
        handle.write(f"{child.pid}\n")
    child.communicate(stdin)
    code = child.returncode
    sys.exit(128 - code if code < 0 else code)


def policy(args: list[str]) -> None:
    if args[:2] != ["allow", "network"]:
        die(f"policy: unsupported {args[:2]}", 2)
    rest = args[2:]
    if len(rest) != 3 or rest[0] != "--sandbox":
        die("policy allow network: expected --sandbox NAME RESOURCES", 2)
    name, resources = rest[1], rest[2]
    sandbox = record(name)
    sandbox["rules"].append(resources)
    (boxes() / f"{name}.json").write_text(json.dumps(sandbox))


def rm(args: list[str]) -> None:
    names = [a for a in args if a not in ("--force", "-f")]
    if any(a.startswith("-") for a in names):
        die(f"rm: unsupported flags {names}", 2)
    if control().get("fail_rm"):
        die("rm: the sandbox daemon did not answer (scripted failure)")
    for name in names:
        record(name)
        pids = boxes() / f"{name}.pids"
        if pids.exists():
            for line in pids.read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(line), signal.SIGKILL)
            pids.unlink()
        (boxes() / f"{name}.json").unlink()
        print(f"Removed sandbox {name}")


def ls(args: list[str]) -> None:
    if any(a not in ("--json", "-q", "--quiet") for a in args):
        die(f"ls: unsupported flags {args}", 2)
    listing = [json.loads(p.read_text()) for p in sorted(boxes().glob("*.json"))]
    items = [
        {"name": s["name"], "agent": s["agent"], "status": "running", "workspace": s["workspace"]}
        for s in listing
    ]
    settings = control()
    if settings.get("ls_banner"):
        print(settings["ls_banner"])
    shape = settings.get("ls_shape", "list")
    if "-q" in args or "--quiet" in args:
        print("\n".join(i["name"] for i in items))
    elif "--json" not in args or shape == "table":
        print(f"{'NAME':<40} {'AGENT':<8} STATUS")
        for item in items:
            print(f"{item['name']:<40} {item['agent']:<8} {item['status']}")
    elif shape == "object":
        print(json.dumps({"sandboxes": items}, indent=2))
    else:
        print(json.dumps(items))


def main() -> None:
    if not STATE.is_dir():
        die("FAKE_SBX_STATE must name an existing directory", 2)
    argv = sys.argv[1:]
    stdin = b"" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
    log(argv, stdin)
    if not argv:
        die("usage: sbx COMMAND", 2)
    command, args = argv[0], argv[1:]
    if command == "create":
        create(args)
    elif command == "exec":
        exec_(args, stdin)
    elif command == "policy":
        policy(args)
    elif command == "rm":
        rm(args)
    elif command == "ls":
        ls(args)
    elif command == "version":
        print("fake-sbx 0.0 (tests/fake_sbx.py)")
    else:
        die(f"unknown command {command!r}", 2)


if __name__ == "__main__":
    main()
