"""Mount rules: any path resolving into a protected tree or one of its ancestors is refused.

Two layers, as in the code: the pure lexical rules of ``sbxkit._model.mounts`` (no filesystem), and
``sbxkit._plan.preflight.resolve_host_path`` against the real filesystem, where symlink chains,
dangling links and special files are resolved and judged by what they really name. Every property
that refuses has a positive control beside it, so a rule that refused everything would fail here
too.
"""

from __future__ import annotations

import os
import posixpath
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sbxkit._model.mounts import (
    MAX_MOUNTS,
    PROTECTED_HOST_PATHS,
    SYSTEM_TARGETS,
    TMPFS_OPTIONS,
    BindMount,
    Mount,
    TmpfsMount,
    VolumeMount,
    check_host_path,
    check_target,
    protected_reason,
    validate_mounts,
)
from sbxkit._model.settings import Settings
from sbxkit._model.spec import Limits, MiB, SandboxSpec, validate_spec
from sbxkit._plan.preflight import resolve_host_path
from sbxkit.errors import SpecError

# Hypothesis builds its Unicode tables on the first text draw (~1.5 s): not slow input.
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FS_PROPS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

SAFE_ROOTS = ("/srv/x", "/home/u/data", "/opt/y", "/tmp/z")
SAFE_TARGETS = ("/data", "/work/x", "/scratch2", "/home/u", "/mnt/in", "/opt/tool")
STATE = "/var/lib/sbxkit-state/leases"  # a plausible supervisor state dir, clear of SAFE_ROOTS


def _ancestors(path: str) -> list[str]:
    """Every proper ancestor of an absolute path, "/" included."""
    parts = path.strip("/").split("/")
    return ["/"] + ["/" + "/".join(parts[:n]) for n in range(1, len(parts))]


PROTECTED_ANCESTORS = sorted(
    {a for p in PROTECTED_HOST_PATHS for a in _ancestors(p)} - set(PROTECTED_HOST_PATHS)
)
"""Ancestors that are not themselves protected paths ("/", "/var", "/var/lib" ...)."""

SYSTEM_ANCESTORS_OK = ("/var",)  # /var is an ancestor of /var/run, not a system target itself

# --- strategies --------------------------------------------------------------------------------

# One path component: printable, no separator, nothing str.strip() would remove, never "..".
_COMPONENT_CHARS = st.characters(
    blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp"), blacklist_characters="/:"
)
component = st.text(_COMPONENT_CHARS, min_size=1, max_size=10).filter(lambda c: c != "..")
ascii_component = st.from_regex(r"[A-Za-z0-9_.-]{1,10}", fullmatch=True).filter(
    lambda c: c not in (".", "..")
)


@st.composite
def suffixes(draw: st.DrawFn, parts: st.SearchStrategy[str] = component) -> str:
    """ "" or "/c1/c2..." with the odd "./", doubled separator and trailing slash."""
    names = draw(st.lists(parts, max_size=4))
    out = ""
    for name in names:
        out += draw(st.sampled_from(["/", "/", "/", "//", "/./"])) + name
    if draw(st.booleans()):
        out += draw(st.sampled_from(["", "/", "/."]))
    return out


def safe_paths(roots: tuple[str, ...] = SAFE_ROOTS) -> st.SearchStrategy[str]:
    return st.builds(lambda root, tail: root + tail, st.sampled_from(roots), suffixes())


def spec_with(mounts: list[Mount]) -> SandboxSpec:
    limits = Limits(cpus=1.0, memory_bytes=64 * MiB, pids=64, output_bytes=MiB, timeout_s=5.0)
    return SandboxSpec(image="busybox", command=["true"], limits=limits, mounts=mounts)


def validate(mounts: list[Mount], **options: Any) -> None:
    validate_mounts(
        mounts,
        enable_bind_mounts=options.get("binds", True),
        enable_named_volumes=options.get("volumes", True),
        state_dir=options.get("state_dir", STATE),
    )


def refused(call: Any, *args: Any, **kwargs: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        call(*args, **kwargs)
    return info.value


# --- pure: host paths --------------------------------------------------------------------------


@PROPS
@given(protected=st.sampled_from(PROTECTED_HOST_PATHS), suffix=suffixes())
def test_anything_inside_a_protected_path_is_refused(protected: str, suffix: str) -> None:
    error = refused(check_host_path, "mounts[0].source", protected + suffix, state_dir=None)

    assert error.field == "mounts[0].source"
    assert "protected host path" in error.rule or "host's root" in error.rule, error


@pytest.mark.parametrize("ancestor", PROTECTED_ANCESTORS)
def test_every_ancestor_of_a_protected_path_is_refused(ancestor: str) -> None:
    for spelling in {ancestor, ancestor.rstrip("/") + "/", ancestor + "/."}:
        error = refused(check_host_path, "mounts[0].source", spelling, state_dir=None)
        assert "ancestor of the protected host path" in error.rule or "host's root" in error.rule


def test_the_ancestor_list_is_the_one_the_issue_means() -> None:
    assert {"/", "/var", "/var/lib"} <= set(PROTECTED_ANCESTORS)
    for path in PROTECTED_HOST_PATHS:
        assert protected_reason(path) is not None
        for ancestor in _ancestors(path):
            assert protected_reason(ancestor) is not None, ancestor


@PROPS
@given(protected=st.sampled_from(PROTECTED_HOST_PATHS), data=st.data())
def test_any_proper_ancestor_of_any_protected_path_is_refused(
    protected: str, data: st.DataObject
) -> None:
    ancestor = data.draw(st.sampled_from(_ancestors(protected)))

    error = refused(check_host_path, "f", ancestor, state_dir=None)

    # An ancestor may itself be protected (/run above /run/docker): either reason will do.
    assert "protected host path" in error.rule or "host's root" in error.rule


@PROPS
@given(path=safe_paths())
def test_safe_paths_are_accepted_and_normalised(path: str) -> None:
    assert check_host_path("f", path, state_dir=None) == posixpath.normpath(path)
    assert check_host_path("f", path, state_dir=STATE) == posixpath.normpath(path)


@PROPS
@given(
    root=st.sampled_from(SAFE_ROOTS + PROTECTED_HOST_PATHS),
    before=st.lists(ascii_component, max_size=3),
    after=st.lists(st.sampled_from(["etc", "run", "var", "x"]), max_size=3),
)
def test_traversal_components_are_refused(root: str, before: list[str], after: list[str]) -> None:
    path = "/".join([root, *before, "..", *after])

    error = refused(check_host_path, "f", path, state_dir=None)

    assert "traversal" in error.rule


@PROPS
@given(
    path=safe_paths(),
    lead=st.sampled_from(["", " ", "\t", "\n", "\u00a0", "\u3000"]),
    trail=st.sampled_from(["", " ", "\t", "\r\n", "\u2003", "\x0b"]),
)
def test_surrounding_whitespace_is_refused(path: str, lead: str, trail: str) -> None:
    if not lead and not trail:
        assert check_host_path("f", path, state_dir=None)  # positive control
        return
    error = refused(check_host_path, "f", lead + path + trail, state_dir=None)

    assert "whitespace" in error.rule


@PROPS
@given(
    path=safe_paths(),
    char=st.sampled_from([chr(c) for c in range(0x20)] + ["\x7f"]),
    data=st.data(),
)
def test_control_characters_anywhere_are_refused(path: str, char: str, data: st.DataObject) -> None:
    at = data.draw(st.integers(min_value=1, max_value=len(path)))
    bad = path[:at] + char + path[at:]
    if bad != bad.strip():
        bad = path[:1] + char + path[1:]  # keep it inside, so the rule under test is control

    error = refused(check_host_path, "f", bad, state_dir=None)

    assert "control characters" in error.rule or "whitespace" in error.rule


@pytest.mark.parametrize("char", ["\x80", "\x85", "\x9b", "\x9f"])
def test_c1_control_characters_are_refused(char: str) -> None:
    refused(check_host_path, "f", f"/srv/a{char}b", state_dir=None)


@PROPS
@given(path=safe_paths(), prefix=st.sampled_from(["", "./", "../", "~/", "srv/"]))
def test_relative_paths_are_refused(path: str, prefix: str) -> None:
    relative = prefix + path.lstrip("/")

    error = refused(check_host_path, "f", relative, state_dir=None)

    assert "absolute" in error.rule or "traversal" in error.rule


def test_an_empty_path_is_refused() -> None:
    assert "empty" in refused(check_host_path, "f", "", state_dir=None).rule


@pytest.mark.parametrize("path", ["//etc", "//var/run/docker.sock", "//proc/1", "//root/.ssh"])
def test_a_doubled_leading_slash_does_not_hide_a_protected_path(path: str) -> None:
    refused(check_host_path, "f", path, state_dir=None)


# --- pure: supervisor state dir ----------------------------------------------------------------


@PROPS
@given(
    root=st.sampled_from(SAFE_ROOTS),
    state_tail=st.lists(ascii_component, min_size=1, max_size=3),
    other=st.lists(ascii_component, min_size=1, max_size=3),
    relation=st.sampled_from(["inside", "ancestor", "equal", "sibling"]),
)
def test_overlap_with_the_supervisor_state_dir_is_refused_both_ways(
    root: str, state_tail: list[str], other: list[str], relation: str
) -> None:
    state = "/".join([root, *state_tail])
    if relation == "inside":
        source = "/".join([state, *other])
    elif relation == "ancestor":
        source = "/".join([root, *state_tail[:-1]])
    elif relation == "equal":
        source = state + "/"
    else:
        source = "/".join([root, *state_tail[:-1], state_tail[-1] + "-x", *other])

    if relation == "sibling":
        assert check_host_path("f", source, state_dir=state) == posixpath.normpath(source)
        return
    error = refused(check_host_path, "f", source, state_dir=state)
    assert "supervisor state directory" in error.rule


def test_overlap_with_the_state_dir_is_refused_through_validate_mounts() -> None:
    mounts: list[Mount] = [BindMount(source="/srv/sbx", target="/data")]

    error = refused(validate, mounts, state_dir="/srv/sbx/state")

    assert error.field == "mounts[0].source"
    validate(mounts, state_dir="/srv/other/state")  # control


# --- pure: targets -----------------------------------------------------------------------------


@PROPS
@given(system=st.sampled_from(SYSTEM_TARGETS), suffix=suffixes(ascii_component))
def test_targets_over_or_below_system_directories_are_refused(system: str, suffix: str) -> None:
    error = refused(check_target, "mounts[0].target", system + suffix)

    # A target not in normal form (e.g. "/usr/") is refused for that before its location.
    assert "container system directory" in error.rule or "normal form" in error.rule


@pytest.mark.parametrize("root", ["/", "/.", "/./"])
def test_target_root_is_refused(root: str) -> None:
    rule = refused(check_target, "f", root).rule
    assert "root" in rule or "normal form" in rule


@PROPS
@given(target=safe_paths(SAFE_TARGETS + SYSTEM_ANCESTORS_OK))
def test_ordinary_targets_are_accepted(target: str) -> None:
    normal = posixpath.normpath(target)
    if normal == target:
        assert check_target("f", target) == target
    else:  # targets must be written in normal form; Docker reports only that
        assert "normal form" in refused(check_target, "f", target).rule


@pytest.mark.parametrize(
    "target", ["data", "./data", "/data/../usr", " /data", "/data\n", "/da\x00ta", ""]
)
def test_malformed_targets_are_refused(target: str) -> None:
    refused(check_target, "f", target)


@pytest.mark.parametrize("target", ["//usr", "//etc/x", "//tmp", "//"])
def test_a_doubled_leading_slash_does_not_hide_a_system_target(target: str) -> None:
    refused(check_target, "f", target)


@pytest.mark.parametrize(
    ("first", "second", "rule"),
    [
        ("/data", "/data", "duplicate"),
        ("/data", "/data/", "duplicate"),
        ("/data/./x", "/data/x", "duplicate"),
        ("/data", "/data/sub", "nests"),
        ("/data/sub", "/data", "nests"),
        ("/a/b/c", "/a", "nests"),
    ],
)
def test_duplicate_and_nested_targets_are_refused(first: str, second: str, rule: str) -> None:
    mounts: list[Mount] = [
        TmpfsMount(target=first, size_bytes=MiB),
        TmpfsMount(target=second, size_bytes=MiB),
    ]

    error = refused(validate, mounts)

    if "normal form" in error.rule:  # a non-normal spelling is refused wherever it stands
        assert error.field in ("mounts[0].target", "mounts[1].target")
    else:
        assert error.field == "mounts[1].target"
        assert rule in error.rule
    control = TmpfsMount(target=posixpath.normpath(first), size_bytes=MiB)
    validate([control, TmpfsMount(target="/elsewhere", size_bytes=MiB)])  # control


def test_a_doubled_slash_target_is_still_a_duplicate() -> None:
    mounts: list[Mount] = [
        TmpfsMount(target="/data", size_bytes=MiB),
        TmpfsMount(target="//data", size_bytes=MiB),
    ]
    refused(validate, mounts)


@PROPS
@given(
    targets=st.lists(st.sampled_from(["/a", "/a/b", "/a/b/c", "/b", "/c/d", "/a/bb"]), max_size=4)
)
def test_targets_are_accepted_iff_pairwise_disjoint(targets: list[str]) -> None:
    mounts: list[Mount] = [TmpfsMount(target=t, size_bytes=MiB) for t in targets]

    def disjoint(x: str, y: str) -> bool:
        return not (x == y or x.startswith(y + "/") or y.startswith(x + "/"))

    ok = all(disjoint(x, y) for i, x in enumerate(targets) for y in targets[i + 1 :])
    if ok:
        validate(mounts)
    else:
        assert refused(validate, mounts).field.endswith(".target")


def test_too_many_mounts_are_refused() -> None:
    mounts: list[Mount] = [
        TmpfsMount(target=f"/m{i}", size_bytes=MiB) for i in range(MAX_MOUNTS + 1)
    ]
    assert refused(validate, mounts).field == "mounts"
    validate(mounts[:MAX_MOUNTS])


# --- pure: kinds off by default, volumes, tmpfs ------------------------------------------------


@pytest.mark.parametrize(
    ("mount", "word"),
    [
        (BindMount(source="/srv/x", target="/data"), "bind mounts are disabled"),
        (VolumeMount(source="work", target="/data"), "named volumes are disabled"),
    ],
)
@pytest.mark.parametrize("index", [0, 2])
def test_binds_and_volumes_are_off_by_default(mount: Mount, word: str, index: int) -> None:
    before: list[Mount] = [TmpfsMount(target=f"/t{i}", size_bytes=MiB) for i in range(index)]
    spec = spec_with([*before, mount])

    error = refused(validate_spec, spec)  # no settings: the defaults
    assert error.field == f"mounts[{index}].type"
    assert word in error.rule
    assert refused(validate_spec, spec, Settings()).field == f"mounts[{index}].type"

    validate_spec(spec, Settings(enable_bind_mounts=True, enable_named_volumes=True))  # control


def test_enabling_one_kind_does_not_enable_the_other() -> None:
    bind = spec_with([BindMount(source="/srv/x", target="/data")])
    volume = spec_with([VolumeMount(source="work", target="/data")])

    assert refused(validate_spec, bind, Settings(enable_named_volumes=True)).field.endswith(".type")
    assert refused(validate_spec, volume, Settings(enable_bind_mounts=True)).field.endswith(".type")
    validate_spec(bind, Settings(enable_bind_mounts=True))
    validate_spec(volume, Settings(enable_named_volumes=True))


def test_mounts_are_read_only_unless_they_say_otherwise() -> None:
    assert BindMount(source="/srv/x", target="/d").read_only is True
    assert VolumeMount(source="v", target="/d").read_only is True


@pytest.mark.parametrize("name", ["a/b", "/abs", "../up", "vol/"])
def test_a_volume_name_with_a_slash_is_refused(name: str) -> None:
    error = refused(validate, [VolumeMount(source=name, target="/data")])

    assert error.field == "mounts[0].source"


@pytest.mark.parametrize("name", ["", " vol", "vol\t", "v\x00l"])
def test_a_blank_or_odd_volume_name_is_refused(name: str) -> None:
    assert refused(validate, [VolumeMount(source=name, target="/data")]).field == "mounts[0].source"


@pytest.mark.parametrize("name", ["work", "a.b_c-1", "Vol9"])
def test_docker_style_volume_names_pass_the_lexical_rules(name: str) -> None:
    validate([VolumeMount(source=name, target="/data")])


@pytest.mark.parametrize("name", ["vol?x=1", "vol#x", "a b", "..", ".", "vol\u00e9", "-vol"])
def test_a_volume_name_outside_dockers_grammar_is_refused(name: str) -> None:
    assert refused(validate, [VolumeMount(source=name, target="/data")]).field == "mounts[0].source"


@pytest.mark.parametrize(("source", "target"), [("/srv/x:y", "/data"), ("/srv/x", "/da:ta")])
def test_a_colon_in_a_bind_path_is_refused(source: str, target: str) -> None:
    refused(validate, [BindMount(source=source, target=target)])


@pytest.mark.parametrize(
    "subpath", ["/abs", "/", "..", "../x", "a/../b", "a/..", " a", "a\n", "a\x01b", ""]
)
def test_a_bad_subpath_is_refused(subpath: str) -> None:
    error = refused(validate, [VolumeMount(source="work", target="/data", subpath=subpath)])

    assert error.field == "mounts[0].subpath"


@pytest.mark.parametrize("subpath", ["a", "a/b", "a/..b", "..a/b"])
def test_a_relative_subpath_passes_the_lexical_rules(subpath: str) -> None:
    validate([VolumeMount(source="work", target="/data", subpath=subpath)])


@pytest.mark.parametrize(("size", "ok"), [(0, False), (-1, False), (-(2**40), False), (1, True)])
def test_tmpfs_size_must_be_positive(size: int, ok: bool) -> None:
    mounts: list[Mount] = [TmpfsMount(target="/scratch2", size_bytes=size)]
    if ok:
        validate(mounts)
    else:
        assert refused(validate, mounts).field == "mounts[0].size_bytes"


@pytest.mark.parametrize(("mode", "ok"), [(-1, False), (0o10000, False), (0, True), (0o7777, True)])
def test_tmpfs_mode_must_be_a_permission_mode(mode: int, ok: bool) -> None:
    mounts: list[Mount] = [TmpfsMount(target="/scratch2", size_bytes=MiB, mode=mode)]
    if ok:
        validate(mounts)
    else:
        assert refused(validate, mounts).field == "mounts[0].mode"


@pytest.mark.parametrize("option", ["suid", "dev", "size=1g", "mode=777", "uid=0", "", "rw "])
def test_unknown_tmpfs_options_are_refused(option: str) -> None:
    mounts: list[Mount] = [TmpfsMount(target="/scratch2", size_bytes=MiB, options=[option])]

    error = refused(validate, mounts)

    assert error.field == "mounts[0].options"
    validate([TmpfsMount(target="/scratch2", size_bytes=MiB, options=sorted(TMPFS_OPTIONS))])


# --- real filesystem: resolve_host_path --------------------------------------------------------

EXISTING_PROTECTED = tuple(p for p in PROTECTED_HOST_PATHS if os.path.lexists(p))
EXISTING_ANCESTORS = tuple(p for p in PROTECTED_ANCESTORS if os.path.isdir(p))


def test_the_host_has_the_paths_these_tests_point_at() -> None:
    # Otherwise the chain tests would only ever see dangling links. (/var/run/docker.sock is
    # there only while a daemon runs: a chain to it is refused as protected either way.)
    for path in ("/etc", "/proc", "/var", "/"):
        assert os.path.lexists(path), path
    assert len(EXISTING_PROTECTED) >= 8
    assert set(EXISTING_ANCESTORS) >= {"/", "/var", "/var/lib"}


def chain(directory: Path, final: str, depth: int, *, relative: bool = False) -> Path:
    """l0 -> l1 -> ... -> l{depth-1} -> final; returns l0."""
    links = [directory / f"l{i}" for i in range(depth)]
    for i, link in enumerate(links):
        target = str(links[i + 1]) if i + 1 < depth else final
        if relative:
            target = os.path.relpath(target, link.parent)
        link.symlink_to(target)
    return links[0]


@pytest.mark.parametrize("final", ["/etc", "/var/run/docker.sock", "/var", "/etc/passwd", "/"])
@pytest.mark.parametrize("relative", [False, True])
def test_a_symlink_chain_into_a_protected_tree_is_refused(
    tmp_path: Path, final: str, relative: bool
) -> None:
    start = chain(tmp_path, final, 3, relative=relative)
    assert check_host_path("f", str(start), state_dir=None)  # lexically it looks harmless

    error = refused(resolve_host_path, "mounts[0].source", str(start), state_dir=None)

    assert error.field == "mounts[0].source"
    assert "protected host path" in error.rule or "host's root" in error.rule


@pytest.mark.parametrize("final", ["/etc/sbxkit-absent", "/run/sbxkit-absent/docker.sock"])
def test_a_dangling_chain_into_a_protected_tree_is_refused_as_protected(
    tmp_path: Path, final: str
) -> None:
    assert not os.path.lexists(final)
    start = chain(tmp_path, final, 2)

    error = refused(resolve_host_path, "mounts[0].source", str(start), state_dir=None)

    assert "protected host path" in error.rule  # not merely "must exist"


def test_a_symlink_to_a_safe_directory_resolves_to_the_real_path(tmp_path: Path) -> None:
    real = tmp_path / "real" / "data"
    real.mkdir(parents=True)
    start = chain(tmp_path, str(real), 2)

    assert resolve_host_path("f", str(start), state_dir=None) == str(real.resolve())
    assert resolve_host_path("f", str(real), state_dir=None) == str(real.resolve())


def test_a_regular_file_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")

    assert resolve_host_path("f", str(tmp_path / "file"), state_dir=None) == str(
        (tmp_path / "file").resolve()
    )


def test_a_missing_path_and_a_dangling_link_are_refused(tmp_path: Path) -> None:
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")

    for path in (tmp_path / "nowhere", tmp_path / "dangling"):
        assert "must exist" in refused(resolve_host_path, "f", str(path), state_dir=None).rule


def test_a_symlink_loop_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")

    refused(resolve_host_path, "f", str(tmp_path / "a"), state_dir=None)


def test_a_fifo_is_refused_as_a_special_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "to-fifo").symlink_to(tmp_path / "fifo")

    for path in ("fifo", "to-fifo"):
        error = refused(resolve_host_path, "f", str(tmp_path / path), state_dir=None)
        assert "special file" in error.rule


def test_a_unix_socket_is_refused_as_a_special_file(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))

        error = refused(resolve_host_path, "f", str(path), state_dir=None)

    assert "special file" in error.rule


@pytest.mark.parametrize("points_at", ["state", "parent", "inside"])
def test_a_symlink_aliasing_the_state_dir_is_refused(tmp_path: Path, points_at: str) -> None:
    state = tmp_path / "home" / "state"
    (state / "leases").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    target = {"state": state, "parent": state.parent, "inside": state / "leases"}[points_at]
    alias = tmp_path / "alias"
    alias.symlink_to(target)

    error = refused(resolve_host_path, "f", str(alias), state_dir=str(state))

    assert "supervisor state directory" in error.rule
    assert resolve_host_path("f", str(tmp_path / "elsewhere"), state_dir=str(state))  # control


def test_a_state_dir_named_through_a_symlink_still_protects_its_real_path(tmp_path: Path) -> None:
    real_state = tmp_path / "real-state"
    real_state.mkdir()
    (tmp_path / "state-link").symlink_to(real_state)

    error = refused(resolve_host_path, "f", str(real_state), state_dir=str(tmp_path / "state-link"))

    assert "supervisor state directory" in error.rule


@st.composite
def chain_plans(draw: st.DrawFn) -> tuple[str, str, int, list[bool], bool]:
    kind = draw(st.sampled_from(["protected", "ancestor", "safe-dir", "safe-file"]))
    final = {
        "protected": lambda: draw(st.sampled_from(EXISTING_PROTECTED)),
        "ancestor": lambda: draw(st.sampled_from(EXISTING_ANCESTORS)),
        "safe-dir": lambda: "<safe>",
        "safe-file": lambda: "<safe>/file",
    }[kind]()
    depth = draw(st.integers(min_value=1, max_value=5))
    relative = draw(st.lists(st.booleans(), min_size=depth, max_size=depth))
    via_dir_link = draw(st.booleans())  # reach the final target through a link to its parent
    return kind, final, depth, relative, via_dir_link


@pytest.fixture
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sbxkit-chain-") as directory:
        yield Path(directory)


@FS_PROPS
@given(plan=chain_plans())
def test_random_symlink_chains_are_refused_iff_they_end_in_a_protected_tree(
    scratch: Path, plan: tuple[str, str, int, list[bool], bool]
) -> None:
    kind, final, depth, relative, via_dir_link = plan
    with tempfile.TemporaryDirectory(dir=scratch) as directory:
        work = Path(directory)
        safe = work / "safe"
        safe.mkdir()
        (safe / "file").write_text("x")
        final = final.replace("<safe>", str(safe))
        if via_dir_link and final != "/":
            (work / "hop").symlink_to(posixpath.dirname(final))
            final = str(work / "hop" / posixpath.basename(final))
        links = [work / "nest" / f"d{i}" / f"l{i}" for i in range(depth)]
        for i, link in enumerate(links):
            link.parent.mkdir(parents=True)
            target = str(links[i + 1]) if i + 1 < depth else final
            if relative[i]:
                target = os.path.relpath(target, link.parent)
            link.symlink_to(target)

        if kind.startswith("safe"):
            real = resolve_host_path("f", str(links[0]), state_dir=None)
            assert real == os.path.realpath(final)
            assert real.startswith(str(safe.resolve()))
        else:
            error = refused(resolve_host_path, "f", str(links[0]), state_dir=None)
            assert "protected host path" in error.rule or "host's root" in error.rule, error
