"""Running the docs' code blocks (tests/doc_blocks.py extracts them): one runner per language,
and the fixtures a block may ask for.

- ``python``: executed in a fresh namespace (``continues``: the previous python block's), with
  the file's working directory as cwd; ``trio``/``asyncio``: top-level ``await`` runs under that
  loop. ``signature:MODULE``: the block's ``def``s are compared with MODULE's (names, kinds,
  defaults present, annotations), never executed.
- ``sh``: ``sh -eu`` with the file's working directory as cwd and this interpreter's scripts
  (``sbxkit``) first on PATH; every command must succeed. ``console``: the ``$ `` lines, the
  same way (the other lines are output, not checked).
- ``toml``: parsed; one with a ``[sandbox]`` table is loaded as a profile (``load_profile``)
  and its host files checked as ``sbxkit mcp`` checks them at start (``check_host_files``),
  after the ``creates:PATH`` blocks before it in its file made them.
- ``json``: parsed. ``ini``: parsed; a systemd unit's ``ExecStart`` of ``sbxkit`` must parse
  with sbxkit's own parser.
"""

from __future__ import annotations

import ast
import asyncio
import configparser
import contextlib
import importlib
import inspect
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

from tests.doc_blocks import Block, extract

BLOCK_TIMEOUT_S = 300.0
BUSYBOX = os.environ.get("SBXKIT_TEST_BUSYBOX_IMAGE", "sbxkit-test/busybox:latest")
PYTHON = os.environ.get("SBXKIT_TEST_PYTHON_IMAGE", "sbxkit-test/python:latest")


class DocState:
    """What the blocks of one file share: a working directory and the python namespaces."""

    def __init__(self) -> None:
        self.workdirs: dict[str, Path] = {}
        self.namespaces: dict[tuple[str, int], dict[str, Any]] = {}
        self.created: dict[tuple[str, int], Path | None] = {}
        """The ``creates:PATH`` blocks run: PATH when it was not there before (ours to remove)."""

    def close(self) -> None:
        """Remove what the ``creates:PATH`` blocks made (only what was not there before), and
        the working directories."""
        for path in self.created.values():
            if path is not None and (path.is_symlink() or path.is_file()):
                path.unlink()
            elif path is not None and path.exists():
                shutil.rmtree(path)
        self.created.clear()
        for workdir in self.workdirs.values():
            shutil.rmtree(workdir)
        self.workdirs.clear()

    def workdir(self, source: str) -> Path:
        if source not in self.workdirs:
            self.workdirs[source] = Path(tempfile.mkdtemp(prefix="sbxkit-doc-"))
        return self.workdirs[source]


# --- python ------------------------------------------------------------------------------------


def previous_python(block: Block, root: Path) -> Block | None:
    """The python block before ``block`` in its file (the one ``continues`` continues)."""
    blocks = extract((root / block.source).read_text(), block.source)
    earlier = [b for b in blocks[: block.index] if b.lang == "python" and b.skip is None]
    return earlier[-1] if earlier else None


def run_python(block: Block, state: DocState, root: Path) -> str:
    """Execute the block; returns what it printed. Raises whatever it raised."""
    key = (block.source, block.index)
    if key in state.namespaces:
        return ""
    namespace: dict[str, Any] = {"__name__": "__doc_block__"}
    if block.fixture("continues") is not None:
        before = previous_python(block, root)
        assert before is not None, f"{block.id}: 'continues', but no python block before it"
        run_python(before, state, root)  # at most once per test session (cached)
        namespace = dict(state.namespaces[(before.source, before.index)])
    loop = "trio" if block.fixture("trio") is not None else None
    loop = "asyncio" if block.fixture("asyncio") is not None else loop
    flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT if loop else 0
    code = compile(block.code, block.id, "exec", flags=flags, dont_inherit=True)
    printed = io.StringIO()
    with contextlib.chdir(state.workdir(block.source)), contextlib.redirect_stdout(printed):
        result = eval(code, namespace)
        if inspect.iscoroutine(result):
            assert loop is not None, f"{block.id}: a top-level await needs fixture trio or asyncio"
            if loop == "trio":

                async def awaited() -> None:
                    await result

                trio.run(awaited)
            else:

                async def awaited_asyncio() -> None:
                    await result

                asyncio.run(awaited_asyncio())
    state.namespaces[key] = namespace
    return printed.getvalue()


def check_signatures(block: Block, module_name: str) -> int:
    """Every ``def`` of the block against ``module_name``'s: the same parameters in the same
    order and kinds, defaults where the code has them, the same annotations. Returns how many
    were compared."""
    module = importlib.import_module(module_name)
    tree = ast.parse(block.code, block.id)
    compared = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        real = inspect.signature(getattr(module, node.name))
        documented = _documented_parameters(node)
        actual = [
            (p.name, p.kind.name, p.default is not inspect.Parameter.empty, _text(p.annotation))
            for p in real.parameters.values()
        ]
        assert documented == actual, f"{block.id}: {node.name}{real} is the code's signature"
        assert _text(real.return_annotation) == _text(
            ast.unparse(node.returns) if node.returns else inspect.Signature.empty
        ), f"{block.id}: {node.name} returns {real.return_annotation}"
        compared += 1
    assert compared, f"{block.id}: no def to compare"
    return compared


def _documented_parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[Any, ...]]:
    args = node.args
    rows: list[tuple[Any, ...]] = []
    positional = [*args.posonlyargs, *args.args]
    first_default = len(positional) - len(args.defaults)
    for i, arg in enumerate(positional):
        kind = "POSITIONAL_ONLY" if arg in args.posonlyargs else "POSITIONAL_OR_KEYWORD"
        rows.append((arg.arg, kind, i >= first_default, _annotation(arg)))
    if args.vararg is not None:
        rows.append((args.vararg.arg, "VAR_POSITIONAL", False, _annotation(args.vararg)))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        rows.append((arg.arg, "KEYWORD_ONLY", default is not None, _annotation(arg)))
    if args.kwarg is not None:
        rows.append((args.kwarg.arg, "VAR_KEYWORD", False, _annotation(args.kwarg)))
    return rows


def _annotation(arg: ast.arg) -> str:
    return _text(ast.unparse(arg.annotation) if arg.annotation else inspect.Parameter.empty)


def _text(annotation: object) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return " ".join(str(text).split())


# --- shells ------------------------------------------------------------------------------------


def shell_script(block: Block) -> str:
    """An ``sh`` block as it is; a ``console`` block's ``$ `` commands (with their ``\\``
    continuation lines)."""
    if block.lang == "sh":
        return block.code
    commands: list[str] = []
    continuing = False
    for line in block.code.splitlines():
        if continuing or line.startswith("$ "):
            commands.append(line if continuing else line[2:])
            continuing = line.endswith("\\")
    return "\n".join(commands) + "\n"


def run_shell(block: Block, state: DocState, extra_env: dict[str, str] | None = None) -> str:
    """Run the block with ``sh -eu``; returns its output, fails on a non-zero status."""
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}", **(extra_env or {})}
    proc = subprocess.run(
        ["sh", "-eu", "-c", shell_script(block)],
        cwd=state.workdir(block.source),
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    output = proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, f"{block.id}: exit status {proc.returncode}:\n{output[-3000:]}"
    return output


# --- data files ----------------------------------------------------------------------------------


def run_creates(block: Block, state: DocState, root: Path) -> None:
    """Run the ``creates:PATH`` blocks before ``block`` in its file (each once per state)."""
    for earlier in extract((root / block.source).read_text(), block.source)[: block.index]:
        made = earlier.fixture("creates")
        key = (earlier.source, earlier.index)
        if made and earlier.skip is None and key not in state.created:
            path = Path(made)
            state.created[key] = None if path.exists() or path.is_symlink() else path
            run_shell(earlier, state)


def check_toml(block: Block, root: Path) -> None:
    """Parsed; a profile is loaded from a file, as a user's is, and its host files checked
    with what the blocks before it create in place."""
    data = tomllib.loads(block.code)
    if "sandbox" not in data:
        return
    from sbxkit import load_profile
    from sbxkit._grammar.profile_files import check_host_files

    state = DocState()
    try:
        run_creates(block, state, root)
        profile_file = state.workdir(block.source) / "profile.toml"
        profile_file.write_text(block.code)
        check_host_files(load_profile(profile_file))
    finally:
        state.close()


def check_json(block: Block) -> None:
    json.loads(block.code)


def check_ini(block: Block) -> None:
    """Parsed as systemd reads a unit (keys may repeat); a ``sbxkit`` ``ExecStart`` must be a
    command line sbxkit's parser accepts."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(block.code)
    if parser.has_option("Service", "ExecStart"):
        argv = shlex.split(parser.get("Service", "ExecStart"))
        if Path(argv[0]).name in ("sbxkit", "sbxkit-supervisor"):
            from sbxkit.cli import build_parser
            from sbxkit.supervisor.config import build_parser as supervisor_parser

            if Path(argv[0]).name == "sbxkit":
                build_parser().parse_args(argv[1:])
            else:
                supervisor_parser().parse_args(argv[1:])


# --- fixtures -------------------------------------------------------------------------------------


@contextlib.contextmanager
def block_fixtures(block: Block, state: DocState, witness: Any, root: Path) -> Iterator[None]:
    """Set up what the block's fixtures promise (tests/doc_blocks.py FIXTURES), then undo it.
    The ``file:NAME`` blocks before it in its file are in the working directory too."""
    workdir = state.workdir(block.source)
    for earlier in extract((root / block.source).read_text(), block.source)[: block.index]:
        name = earlier.fixture("file")
        if name:
            (workdir / name).write_text(earlier.code)
    run_creates(block, state, root)
    made = block.fixture("creates")
    if made and (block.source, block.index) not in state.created:
        path = Path(made)
        state.created[(block.source, block.index)] = None if path.exists() else path
    with contextlib.ExitStack() as stack:
        if block.fixture("busybox-image") is not None:
            stack.enter_context(_image_alias(witness, BUSYBOX, "busybox", "latest"))
        name = block.fixture("file")
        if name:
            (state.workdir(block.source) / name).write_text(block.code)
        yield


@contextlib.contextmanager
def _image_alias(witness: Any, source: str, repo: str, tag: str) -> Iterator[None]:
    """``repo:tag`` names ``source`` for the block; removed after, unless it was there."""
    reference = f"{repo}:{tag}"
    existed = witness.image_exists(reference)
    if not existed:
        response = witness.session.post(
            f"{witness.base}/images/{source}/tag", params={"repo": repo, "tag": tag}, timeout=30
        )
        response.raise_for_status()
    try:
        yield
    finally:
        if not existed:
            witness.session.delete(f"{witness.base}/images/{reference}", timeout=30)
