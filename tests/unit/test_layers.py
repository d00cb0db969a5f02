"""The import graph docs/architecture.md promises: dependencies point down, pure cores import no
I/O."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "sbxkit"

# Pure cores: bytes or structs in, structs or events out. No trio, no sockets, no os.
PURE = [
    "engine/frames.py",
    "engine/models.py",
    "output.py",
    "spec.py",
    "policy.py",
    "verify.py",
    "result.py",
    "errors.py",
    "mounts.py",
    "rules.py",
    "gpu.py",
    "settings.py",
    "usage.py",
    "supervisor/wire.py",
    "supervisor/framing.py",
    "supervisor/handoff_wire.py",
    "supervisor/records.py",
    "supervisor/proof.py",
    "admission.py",
    "predicates.py",
    "textcheck.py",
    "image_ref.py",
    "daemon_messages.py",
    "call_checks.py",
    "exec_scripts.py",
    "pool/sizing.py",
    "pool/line.py",
    "pool/shape.py",
    "argtypes.py",
    "units.py",
    "uids.py",
    "mcp/options.py",
    "mcp/arguments.py",
    "mcp/policy.py",
    "mcp/quotas.py",
    "mcp/shapes.py",
    "mcp/schemas.py",
    "mcp/tokens.py",
    "network/names.py",
    "network/allow.py",
    "network/addresses.py",
    "network/terms.py",
    "network/request.py",
    "network/clienthello.py",
    "network/audit.py",
    "network/refusals.py",
]
IO_MODULES = {"trio", "socket", "select", "subprocess", "os", "h11", "asyncio", "threading"}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("module", PURE)
def test_pure_cores_do_no_io(module: str) -> None:
    roots = {name.split(".")[0] for name in imports_of(ROOT / module)}
    assert not roots & IO_MODULES, f"{module} imports {sorted(roots & IO_MODULES)}"


@pytest.mark.parametrize("path", sorted((ROOT / "engine").glob("*.py")), ids=lambda p: p.name)
def test_engine_knows_nothing_of_sandboxes(path: Path) -> None:
    ours = {name for name in imports_of(path) if name.startswith("sbxkit")}
    allowed = {"sbxkit.errors"} | {n for n in ours if n.startswith("sbxkit.engine")}
    assert ours <= allowed, f"{path.name} imports {sorted(ours - allowed)}"


def test_policy_knows_nothing_of_the_engine_client() -> None:
    for module in ("spec.py", "policy.py", "verify.py"):
        ours = {n for n in imports_of(ROOT / module) if n.startswith("sbxkit.engine")}
        assert ours <= {"sbxkit.engine.models"}, f"{module} imports {sorted(ours)}"


def test_the_test_can_fail() -> None:
    # A module importing trio must be caught by the same check the pure modules pass.
    assert "trio" in imports_of(ROOT / "attached.py")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """sbxkit module → the sbxkit modules it imports, function-level imports included (a
    cycle hidden behind a late import is still a cycle); TYPE_CHECKING-only imports too."""
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in imports_of(path):
            # "from sbxkit.cli import run_command" names a submodule: count the deepest module.
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name and imported.startswith("sbxkit."):
                targets.add(imported)
        graph[name] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle_in_the_package() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, " → ".join(cycle or [])


def test_the_cycle_check_can_fail() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


MAX_MODULE_LINES = 600
"""Issue 11: a module a newcomer can hold in their head."""


def test_no_module_is_over_600_lines() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for path in ROOT.rglob("*.py")
    }
    assert max(sizes.values()) > 100  # the walk found the package
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}
