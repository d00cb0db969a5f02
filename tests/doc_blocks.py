"""The fenced code blocks of README.md and docs/*.md, and what each asks of the test that runs
it (pure: text in, blocks out). tests/unit/test_doc_blocks.py and tests/engine/test_docs.py run
them, so the docs cannot drift from the code.

The convention (README.md's "Docs that run"): a block runs as written, unless the HTML comment
line directly above its opening fence says otherwise:

    <!-- doc-test: skip REASON -->          not run; the reason is mandatory
    <!-- doc-test: fixture NAME [NAME...] -->  run with these fixtures (``FIXTURES``)

A block's language is the first word of its info string. ``python``, ``sh``, ``console``,
``toml``, ``json`` and ``ini`` are run (or parsed and validated); ``text`` is prose in a box — a
diagram, a synopsis, output — and is not code. A block with no language, or one no runner
knows, is an error: say what it is.

A python block with a top-level ``await`` cannot run as a user would paste it into a file: its
first line must say it is a fragment (``# fragment: ...``), or it is shown whole (imports,
``async def main``, ``trio.run(main)``). A profile that names host files is checked with them
in place: an ``sh`` block before it makes them (``creates:PATH``), in the reader's view.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = frozenset({"python", "sh", "console", "toml", "json", "ini"})
NOT_CODE = frozenset({"text"})
FIXTURES = {
    "continues": "python: runs in the namespace the previous python block of the same file left",
    "trio": "python: a top-level await runs under trio (as in a trio REPL)",
    "asyncio": "python: a top-level await runs under asyncio (as in python -m asyncio)",
    "file": "file:NAME: the block is also written to NAME in the file's working directory",
    "signature": "signature:MODULE: python signatures, checked against MODULE's own",
    "busybox-image": "busybox:latest is present (tagged from the test image: nothing is pulled)",
    "creates": "creates:PATH: an sh block making PATH, run before the checks of the blocks after "
    "it in its file (profiles naming host files); PATH is removed after, unless it was there",
}
"""Every fixture a block may ask for: its name (before any ``:``) and what it provides."""

FRAGMENT = "# fragment"
"""How a python block with a top-level ``await`` starts: the reader sees it is not whole."""

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*doc-test:(?P<body>.*?)-->\s*$")


class DocBlockError(Exception):
    """A block breaks the convention: its file and line say where."""


@dataclass(frozen=True)
class Block:
    source: str
    """The file, relative to the repository (``docs/pool.md``)."""
    line: int
    """The opening fence's line (1-based)."""
    lang: str
    code: str
    skip: str | None = None
    fixtures: tuple[str, ...] = ()
    index: int = 0
    """Its place among the file's blocks (0-based)."""

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}"

    def fixture(self, name: str) -> str | None:
        """The argument of fixture ``name`` (``file:task.py`` → ``task.py``; ``""`` for a
        fixture without one), or None when the block does not ask for it."""
        for given in self.fixtures:
            base, _, argument = given.partition(":")
            if base == name:
                return argument
        return None


def top_level_await(code: str) -> bool:
    """Whether ``code`` compiles only as a top-level-await fragment (not as a module)."""
    try:
        compile(code, "<block>", "exec", dont_inherit=True)  # ast.parse accepts a bare await
    except SyntaxError:
        try:
            compile(
                code, "<block>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
            )
        except SyntaxError:
            return False
        return True
    return False


def _check_creates(lang: str, fixtures: tuple[str, ...], where: str) -> None:
    for given in fixtures:
        base, _, path = given.partition(":")
        if base == "creates" and (lang != "sh" or not path.startswith("/") or path.count("/") < 2):
            raise DocBlockError(f"{where}: creates:PATH is an sh block's, PATH absolute, below /")


def _check_fragment(lang: str, code: str, where: str) -> None:
    if lang == "python" and top_level_await(code) and not code.startswith(FRAGMENT):
        raise DocBlockError(
            f"{where}: a top-level await: show it whole (imports, async def main, "
            f"trio.run(main)) or start it with a line '{FRAGMENT}: ...' saying where it runs"
        )


def _directive(line: str, where: str) -> tuple[str | None, tuple[str, ...]]:
    match = _DIRECTIVE.match(line)
    if match is None:
        if "doc-test" in line:
            raise DocBlockError(f"{where}: not a doc-test directive: {line.strip()!r}")
        return None, ()
    kind, _, rest = match["body"].strip().partition(" ")
    rest = rest.strip()
    if kind == "skip":
        if not rest:
            raise DocBlockError(f"{where}: a skip must say why: <!-- doc-test: skip REASON -->")
        return rest, ()
    if kind == "fixture":
        names = tuple(rest.split())
        if not names:
            raise DocBlockError(f"{where}: name the fixture: <!-- doc-test: fixture NAME -->")
        for name in names:
            base, colon, argument = name.partition(":")
            if base not in FIXTURES:
                raise DocBlockError(
                    f"{where}: unknown fixture {base!r} (known: {sorted(FIXTURES)})"
                )
            if base in ("file", "signature", "creates") and not (colon and argument):
                raise DocBlockError(f"{where}: fixture {base} needs an argument: {base}:NAME")
        return None, names
    raise DocBlockError(f"{where}: a directive is 'skip REASON' or 'fixture NAME', not {kind!r}")


def _judge(info: str, above: str, where: str) -> tuple[str, str | None, tuple[str, ...]]:
    """The block's language, skip reason and fixtures, or why it breaks the convention."""
    lang = info.split()[0].lower() if info else ""
    if not lang:
        raise DocBlockError(
            f"{where}: say the block's language ({', '.join(sorted(RUN))}, or text for a "
            "diagram, a synopsis or output)"
        )
    if lang not in RUN | NOT_CODE:
        raise DocBlockError(
            f"{where}: no runner for {lang!r} blocks: use one of {sorted(RUN | NOT_CODE)} or "
            "skip it with a reason"
        )
    skip, fixtures = _directive(above, where)
    if lang in NOT_CODE and (skip or fixtures):
        raise DocBlockError(f"{where}: a text block is never run: it needs no directive")
    return lang, skip, fixtures


def extract(text: str, source: str, errors: list[str] | None = None) -> list[Block]:
    """Every fenced block of ``text`` (a Markdown file named ``source``), in order. A block
    that breaks the convention raises ``DocBlockError``, or, given ``errors``, is reported
    there and left out."""
    blocks: list[Block] = []
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        opening = _FENCE.match(lines[number])
        if opening is None:
            number += 1
            continue
        where = f"{source}:{number + 1}"
        indent, fence = opening["indent"], opening["fence"]
        info = opening["info"].strip()
        body: list[str] = []
        end = number + 1
        while end < len(lines):
            closing = _FENCE.match(lines[end])
            if closing and closing["fence"].startswith(fence) and not closing["info"].strip():
                break
            body.append(lines[end][len(indent) :] if lines[end].startswith(indent) else lines[end])
            end += 1
        else:
            raise DocBlockError(f"{where}: the fence is never closed")
        try:
            lang, skip, fixtures = _judge(info, lines[number - 1] if number else "", where)
            _check_fragment(lang, "\n".join(body) + "\n", where)
            _check_creates(lang, fixtures, where)
        except DocBlockError as exc:
            if errors is None:
                raise
            errors.append(str(exc))
            number = end + 1
            continue
        blocks.append(
            Block(
                source=source,
                line=number + 1,
                lang=lang,
                code="\n".join(body) + "\n",
                skip=skip,
                fixtures=fixtures,
                index=len(blocks),
            )
        )
        number = end + 1
    return blocks


def doc_files(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def all_blocks(root: Path = ROOT, errors: list[str] | None = None) -> list[Block]:
    """Every block of the docs; with ``errors``, those breaking the convention go there."""
    return [
        block
        for path in doc_files(root)
        for block in extract(path.read_text(), str(path.relative_to(root)), errors)
    ]
