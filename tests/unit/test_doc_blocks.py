"""Every fenced block of README.md and docs/*.md follows the doc-test convention
(tests/doc_blocks.py), and the blocks that need no engine — TOML profiles, JSON, ini units,
documented signatures — hold against the code. The python and shell blocks run against the
real engine in tests/engine/test_docs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from sbxkit.errors import SpecError
from tests.doc_blocks import FRAGMENT, ROOT, Block, DocBlockError, all_blocks, extract
from tests.doc_runs import check_ini, check_json, check_signatures, check_toml

ERRORS: list[str] = []
BLOCKS = all_blocks(errors=ERRORS)


def test_every_block_follows_the_convention() -> None:
    assert ERRORS == []


def test_the_extractor_finds_the_docs_blocks() -> None:
    assert len(BLOCKS) >= 30  # the walk found README.md and docs/*.md
    assert {b.source for b in BLOCKS} >= {"README.md", "docs/pool.md", "docs/interactive.md"}
    skipped = [b for b in BLOCKS if b.skip is not None]
    assert len(skipped) * 6 <= len(BLOCKS), [b.id for b in skipped]  # at most one in six


@pytest.mark.parametrize(
    "block",
    [b for b in BLOCKS if b.lang in ("toml", "json", "ini") and b.skip is None],
    ids=lambda b: b.id,
)
def test_data_blocks_parse_and_profiles_validate(block: Block) -> None:
    if block.lang == "toml":
        check_toml(block, ROOT)
    else:
        {"json": check_json, "ini": check_ini}[block.lang](block)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.fixture("signature")], ids=lambda b: b.id)
def test_documented_signatures_are_the_codes(block: Block) -> None:
    module = block.fixture("signature")
    assert module
    assert check_signatures(block, module) >= 1


# --- the convention ---------------------------------------------------------------------------


def one(text: str) -> Block:
    [block] = extract(text, "x.md")
    return block


def test_a_block_runs_as_written_by_default() -> None:
    block = one("intro\n\n```python\nprint(1)\n```\n")
    assert (block.lang, block.code, block.skip, block.fixtures, block.line) == (
        "python",
        "print(1)\n",
        None,
        (),
        3,
    )


def test_the_comment_directly_above_the_fence_is_read() -> None:
    skipped = one("<!-- doc-test: skip needs a GPU -->\n```sh\nnvidia-smi\n```\n")
    assert skipped.skip == "needs a GPU"
    fixed = one(
        "<!-- doc-test: fixture continues trio -->\n```python\n# fragment: in main\nawait x\n```\n"
    )
    assert fixed.fixtures == ("continues", "trio")
    assert fixed.fixture("trio") == ""
    assert fixed.fixture("asyncio") is None
    saved = one("<!--doc-test: fixture file:task.py-->\n```python\npass\n```\n")
    assert saved.fixture("file") == "task.py"
    far = one("<!-- doc-test: skip too far -->\n\n```sh\ntrue\n```\n")
    assert far.skip is None  # not directly above: not its directive


def test_a_fragment_says_so_and_a_whole_program_needs_nothing() -> None:
    fragment = one("```python\n# fragment: in main() above\nawait sbxkit.run(spec)\n```\n")
    assert fragment.code.startswith(FRAGMENT)
    main = "async def main():\n    await trio.sleep(0)\n"
    whole = f"```python\nimport trio\n\n{main}\ntrio.run(main)\n```\n"
    assert one(whole).lang == "python"
    assert one("```python\nprint(\n```\n").lang == "python"  # not python at all: not judged here


def test_profiles_are_checked_with_the_files_the_blocks_before_make(tmp_path: Path) -> None:
    """A profile naming a host file that nothing made fails the check by its key and path;
    with the creates:PATH block before it, it passes, and PATH is removed after."""
    made = tmp_path / "datasets"
    profile = (
        '[sandbox.docker]\nimage = "sbxkit-test/busybox:latest"\nenable_bind_mounts = true\n'
        '[sandbox.docker.limits]\ncpus = 1\nmemory = "64m"\npids = 32\nmax_output = "1m"\n'
        f'timeout = 10\n[[sandbox.docker.mounts]]\ntype = "bind"\nsource = "{made}"\n'
        'target = "/data"\n'
    )
    bare = tmp_path / "bare.md"
    bare.write_text(f"```toml\n{profile}```\n")
    [block] = extract(bare.read_text(), "bare.md")
    with pytest.raises(SpecError, match=rf"sandbox.docker.mounts\[0\].source: {made} must exist"):
        check_toml(block, tmp_path)
    setup = tmp_path / "setup.md"
    setup.write_text(
        f"<!-- doc-test: fixture creates:{made} -->\n```sh\nmkdir {made}\n```\n\n"
        f"```toml\n{profile}```\n"
    )
    [_, block] = extract(setup.read_text(), "setup.md")
    check_toml(block, tmp_path)
    assert not made.exists()  # made for the check, removed after


def test_an_indented_block_is_dedented() -> None:
    block = one("- item\n\n  ```sh\n  echo a\n    echo b\n  ```\n")
    assert block.code == "echo a\n  echo b\n"


def test_text_blocks_are_not_code_and_take_no_directive() -> None:
    assert one("```text\na ──► b\n```\n").lang == "text"
    with pytest.raises(DocBlockError, match="never run"):
        extract("<!-- doc-test: skip x -->\n```text\na\n```\n", "x.md")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("```\nwhat is this\n```\n", "say the block's language"),
        ("```go\nfunc main() {}\n```\n", "no runner for 'go'"),
        ("<!-- doc-test: skip -->\n```sh\ntrue\n```\n", "a skip must say why"),
        ("<!-- doc-test: skip   -->\n```sh\ntrue\n```\n", "a skip must say why"),
        ("<!-- doc-test: fixture nope -->\n```sh\ntrue\n```\n", "unknown fixture 'nope'"),
        ("<!-- doc-test: fixture file -->\n```sh\ntrue\n```\n", "needs an argument"),
        ("<!-- doc-test: run -->\n```sh\ntrue\n```\n", "not 'run'"),
        ("<!-- doc-test skip x -->\n```sh\ntrue\n```\n", "not a doc-test directive"),
        ("```sh\ntrue\n", "never closed"),
        ("```python\nawait x\n```\n", "a top-level await: show it whole"),
        ("```python\nasync with a:\n    pass\n```\n", "or start it with a line '# fragment"),
        ("<!-- doc-test: skip x -->\n```python\nawait x\n```\n", "a top-level await"),
        ("<!-- doc-test: fixture creates -->\n```sh\ntrue\n```\n", "needs an argument"),
        ("<!-- doc-test: fixture creates:x -->\n```sh\ntrue\n```\n", "PATH absolute"),
        ("<!-- doc-test: fixture creates:/ -->\n```sh\ntrue\n```\n", "below /"),
        ("<!-- doc-test: fixture creates:/tmp/a -->\n```toml\n```\n", "an sh block's"),
    ],
)
def test_a_block_breaking_the_convention_is_refused(text: str, says: str) -> None:
    with pytest.raises(DocBlockError, match=says):
        extract(text, "x.md")


def test_a_stale_signature_is_caught() -> None:
    """The grants API as docs/grants.md showed it before issue 25: keywords the code no longer
    takes (engine, owner ...) and no backend."""
    stale = one(
        "```python\nasync def run_with_grants(spec: SandboxSpec, grants: Grants, "
        "stdin: bytes | None = None, *, engine: Engine | None = None, "
        "success: Callable[[RunResult], bool] = exited_zero, work_dir: str | None = None"
        ") -> GrantResult: ...\n```\n"
    )
    with pytest.raises(AssertionError, match="the code's signature"):
        check_signatures(stale, "sbxkit._consumers.broker")
