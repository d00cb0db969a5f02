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
    "_lifecycle/output.py",
    "_model/spec.py",
    "_plan/policy.py",
    "_plan/verify.py",
    "_model/result.py",
    "errors.py",
    "_model/mounts.py",
    "_model/rules.py",
    "_model/bounds.py",
    "_model/gpu.py",
    "_model/settings.py",
    "_lifecycle/usage.py",
    "_protocol/wire.py",
    "_protocol/framing.py",
    "_protocol/handoff_wire.py",
    "_protocol/records.py",
    "_protocol/proof.py",
    "_lifecycle/admission.py",
    "_model/predicates.py",
    "_model/textcheck.py",
    "_model/image_ref.py",
    "_model/call_checks.py",
    "_consumers/exec_scripts.py",
    "_consumers/tar_stream.py",
    "_consumers/interp_frames.py",
    "_consumers/interp_program.py",
    "pool/sizing.py",
    "pool/line.py",
    "pool/shape.py",
    "_util/argtypes.py",
    "_model/units.py",
    "_model/uids.py",
    "_grammar/mcp_options.py",
    "mcp/arguments.py",
    "mcp/policy.py",
    "mcp/quotas.py",
    "mcp/shapes.py",
    "mcp/schemas.py",
    "mcp/schema_parts.py",
    "mcp/process_schemas.py",
    "mcp/process_calls.py",
    "mcp/tokens.py",
    "_model/network_names.py",
    "_model/network_allow.py",
    "network/addresses.py",
    "_model/network_terms.py",
    "network/request.py",
    "network/clienthello.py",
    "_model/network_audit.py",
    "network/refusals.py",
    "_kernel/memevents.py",
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
    # sbxkit._util.public: only the table that makes Engine show as sbxkit.Engine.
    allowed = {"sbxkit.errors", "sbxkit._util.public"}
    allowed |= {n for n in ours if n.startswith("sbxkit.engine")}
    assert ours <= allowed, f"{path.name} imports {sorted(ours - allowed)}"


def test_policy_knows_nothing_of_the_engine_client() -> None:
    for module in ("_model/spec.py", "_plan/policy.py", "_plan/verify.py"):
        ours = {n for n in imports_of(ROOT / module) if n.startswith("sbxkit.engine")}
        assert ours <= {"sbxkit.engine.models"}, f"{module} imports {sorted(ours)}"


def test_the_test_can_fail() -> None:
    # A module importing trio must be caught by the same check the pure modules pass.
    assert "trio" in imports_of(ROOT / "_lifecycle" / "attached.py")


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


LAYERS: list[tuple[str, ...]] = [
    ("sbxkit.errors",),
    ("sbxkit._util",),
    ("sbxkit.engine",),
    ("sbxkit._model",),
    ("sbxkit._kernel", "sbxkit._protocol"),
    ("sbxkit.network",),
    ("sbxkit._plan",),
    ("sbxkit._lifecycle",),
    ("sbxkit.backends",),
    ("sbxkit.pool",),
    ("sbxkit._consumers",),
    ("sbxkit._grammar",),
    ("sbxkit.supervisor",),
    ("sbxkit.cluster", "sbxkit.mcp"),
    ("sbxkit.cli",),
    ("sbxkit.handoff",),
    ("sbxkit.aio", "sbxkit.blocking", "sbxkit.inspect_provider", "sbxkit.__main__", "sbxkit"),
    ("sbxkit.integrations",),  # frameworks' adapters, on the public surfaces
]
"""The floor plan, ground floor first (docs/architecture.md): a package imports only packages
on lower floors, never one beside it or above it; inside a package, anything."""


def package_of(module: str) -> str:
    """The floor-plan unit a module belongs to: ``sbxkit.X`` (a package or a top module)."""
    return ".".join(module.split(".")[:2])


def floor_problems(graph: dict[str, set[str]], layers: list[tuple[str, ...]]) -> list[str]:
    floor = {package: level for level, row in enumerate(layers) for package in row}
    problems = []
    for module, targets in sorted(graph.items()):
        home = package_of(module)
        if home not in floor:
            problems.append(f"{module}: its package {home} is on no floor")
            continue
        for target in sorted(targets):
            there = package_of(target)
            if there == home:
                continue
            if floor.get(there, len(layers)) >= floor[home]:
                problems.append(f"{module} imports {target}: {there} is not below {home}")
    return problems


def test_every_package_imports_only_packages_below_it() -> None:
    assert floor_problems(import_graph(), LAYERS) == []


def test_the_floor_check_can_fail() -> None:
    graph = {"sbxkit._model.spec": {"sbxkit._plan.plan"}, "sbxkit._plan.plan": set()}
    assert floor_problems(graph, LAYERS) == [
        "sbxkit._model.spec imports sbxkit._plan.plan: sbxkit._plan is not below sbxkit._model"
    ]
    sideways = {"sbxkit.mcp.hub": {"sbxkit.cluster.api"}, "sbxkit.cluster.api": set()}
    assert floor_problems(sideways, LAYERS) == [
        "sbxkit.mcp.hub imports sbxkit.cluster.api: sbxkit.cluster is not below sbxkit.mcp"
    ]
    assert floor_problems({"sbxkit.elsewhere": set()}, LAYERS) == [
        "sbxkit.elsewhere: its package sbxkit.elsewhere is on no floor"
    ]


def test_the_fingerprinted_sources_exist() -> None:
    """The supervisor's handshake and a cluster's join hash files by path: a moved module
    must move in these lists too, or every handshake fails."""
    from sbxkit._protocol.fingerprint import SOURCES
    from sbxkit.cluster.agent import WIRE_SOURCES

    missing = [path for path in (*SOURCES, *WIRE_SOURCES) if not (ROOT / path).is_file()]
    assert missing == []


ORCHESTRATOR = "sbxkit._model.spec"
"""Validation's one downward pass (docs/architecture.md): ``_plan.plan.check_spec`` calls
``validate_spec`` here, which calls the field-family checkers of ``_model`` in turn."""


def callers_back_up(graph: dict[str, set[str]], orchestrator: str) -> list[str]:
    """The modules of the orchestrator's own package that import it: a checker that calls
    back up into the pass that called it."""
    home = package_of(orchestrator)
    return sorted(
        m for m, targets in graph.items() if package_of(m) == home and orchestrator in targets
    )


def test_validations_checkers_never_call_back_up() -> None:
    graph = import_graph()
    checkers = graph[ORCHESTRATOR]
    # the pass reaches its checkers (a walk that found none would hold vacuously)
    assert {"sbxkit._model.mounts", "sbxkit._model.rules", "sbxkit._model.textcheck"} <= checkers
    assert callers_back_up(graph, ORCHESTRATOR) == []


def test_the_call_back_check_can_fail() -> None:
    graph = {ORCHESTRATOR: {"sbxkit._model.rules"}, "sbxkit._model.rules": {ORCHESTRATOR}}
    assert callers_back_up(graph, ORCHESTRATOR) == ["sbxkit._model.rules"]


def modules_the_plan_leaves_out(doc: str, root: Path) -> list[str]:
    """Modules docs/architecture.md never names (as `name` or name.py): a newcomer reading
    it could not find them."""
    return sorted(
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
        and f"`{path.stem}`" not in doc
        and f"{path.stem}.py" not in doc
    )


def test_the_floor_plan_names_every_module() -> None:
    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    assert modules_the_plan_leaves_out(doc, ROOT) == []


def test_the_module_list_check_can_fail() -> None:
    assert "cluster/seal.py" in modules_the_plan_leaves_out("", ROOT)
