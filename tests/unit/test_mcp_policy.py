"""sbxkit mcp's pure cores: the profile's [mcp] table, tool arguments, the operator's ceilings,
quotas, the tools' schemas — every refusal names the field and the rule, before anything runs.
"""

from __future__ import annotations

import base64
from typing import Any

import jsonschema
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sbxkit._consumers.interp_frames import CodeError, CodeResult
from sbxkit._grammar.mcp_options import parse_http_address
from sbxkit._grammar.profile import LIMIT_FIELDS, decode_profile
from sbxkit._model.network_ports import PortForward
from sbxkit._model.spec import MiB
from sbxkit.errors import QuotaExhausted, SbxError, SpecError
from sbxkit.mcp.arguments import (
    ARGS,
    MAX_RUN_FILES,
    ExecArgs,
    OpenArgs,
    ReadFileArgs,
    RunArgs,
    WriteFileArgs,
    content_bytes,
    decode_args,
    file_path,
)
from sbxkit.mcp.policy import (
    McpPolicy,
    exec_request,
    open_request,
    policy_from_profile,
    run_request,
)
from sbxkit.mcp.python_calls import python_fields, python_parts
from sbxkit.mcp.quotas import Quotas
from sbxkit.mcp.schemas import tool_definitions
from sbxkit.mcp.shapes import error_fields

PYTHON = "sbxkit-test/python:latest"
BUSYBOX = "sbxkit-test/busybox:latest"
PROFILE = f"""
[sandbox.docker]
image = "{PYTHON}"
enable_bind_mounts = true

[sandbox.docker.env]
OPERATOR = "set"

[sandbox.docker.limits]
cpus = 1
memory = "256m"
pids = 64
max_output = "64k"
timeout = 30
fsize = "8m"
scratch = "32m"
shm = "16m"

[[sandbox.docker.mounts]]
type = "bind"
source = "/usr/share"
target = "/data"

[mcp]
images = ["{PYTHON}", "{BUSYBOX}"]
max_sandboxes_per_client = 2
max_sandboxes = 3
lifetime = 600
idle_timeout = 60
max_file_bytes = "1k"
"""
SANDBOX_ID = "sbx-" + "0" * 24


@pytest.fixture(scope="module")
def policy() -> McpPolicy:
    return policy_from_profile(decode_profile(PROFILE))


def refused(call: Any, *args: Any) -> SpecError:
    with pytest.raises(SpecError) as caught:
        call(*args)
    return caught.value


# --- the [mcp] table -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "field", "rule"),
    [
        ("imagez = []", "mcp.imagez", "unknown field"),
        ('images = ["Bad:1"]', "mcp.images[0]", "lowercase"),
        (f'images = ["{PYTHON}", "{PYTHON}"]', "mcp.images[1]", "listed twice"),
        ("max_sandboxes = 0", "mcp.max_sandboxes", ">= 1"),
        ("max_sandboxes = 100000", "mcp.max_sandboxes", "<= 4096"),
        ("max_sandboxes_per_client = true", "mcp.max_sandboxes_per_client", "int"),
        ("max_sandboxes_per_client = 5\nmax_sandboxes = 4", "mcp.max_sandboxes_per_client", "<="),
        ("lifetime = 0.5", "mcp.lifetime", "seconds"),
        ("idle_timeout = 1e12", "mcp.idle_timeout", "seconds"),
        ('max_file_bytes = "1g"', "mcp.max_file_bytes", "64 MiB"),
        ('max_file_bytes = "lots"', "mcp.max_file_bytes", "not a size"),
        ("max_file_bytes = 0", "mcp.max_file_bytes", ">= 1"),
    ],
)
def test_the_mcp_table_is_checked_by_path(table: str, field: str, rule: str) -> None:
    error = refused(decode_profile, f"[sandbox.docker]\n[mcp]\n{table}\n")
    assert error.field == field
    assert rule in error.rule


def test_a_profile_without_the_table_still_decodes() -> None:
    assert decode_profile("[sandbox.docker]\n").mcp is None


@pytest.mark.parametrize(
    ("profile", "field"),
    [
        # sessions need Docker: the microVM runtime is refused at start
        (
            f'[sandbox]\nruntime = "sandbox"\n[sandbox.sbx]\ntemplate = "{PYTHON}"\n'
            "[sandbox.docker]\n",
            "sandbox.runtime",
        ),
        ("[sandbox.docker]\n[sandbox.docker.limits]\ncpus = 1\n", "mcp.images"),
        (PROFILE.replace(f'image = "{PYTHON}"', 'image = "other:1"'), "sandbox.docker.image"),
        (
            PROFILE.replace("pids = 64\n", "").replace("timeout = 30\n", ""),
            "sandbox.docker.limits.pids, sandbox.docker.limits.timeout",
        ),
    ],
)
def test_a_server_needs_an_image_and_every_mandatory_ceiling(profile: str, field: str) -> None:
    assert refused(policy_from_profile, decode_profile(profile)).field == field


def test_the_policy_takes_the_profile(policy: McpPolicy) -> None:
    assert policy.images == (PYTHON, BUSYBOX)
    assert policy.base.image == PYTHON
    assert policy.base.workdir == "/tmp"
    assert policy.ceilings.memory_bytes == 256 * MiB
    assert policy.file_bytes == 1024


# --- arguments ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "kind", "field", "rule"),
    [
        ({}, RunArgs, "command", "required"),
        ({"command": "ls -l"}, RunArgs, "command", "array"),
        ({"command": []}, RunArgs, "command", "non-empty"),
        ({"command": [""]}, RunArgs, "command[0]", "empty"),
        ({"command": ["a", 1]}, RunArgs, "command[1]", "str"),
        ({"command": ["a\0"]}, RunArgs, "command[0]", "NUL"),
        ({"command": ["a"], "user": "0:0"}, RunArgs, "user", "unknown field"),
        ({"command": ["a"], "network": "host"}, RunArgs, "network", "unknown field"),
        ({"command": ["a"], "limits": {"memroy": "1g"}}, RunArgs, "limits.memroy", "unknown"),
        ({"command": ["a"], "limits": {"cpus": "2"}}, RunArgs, "limits.cpus", "float"),
        ({"command": ["a"], "env": {"A B": "1"}}, RunArgs, "env['A B']", "whitespace"),
        ({"command": ["a"], "stdin": "\ud800"}, RunArgs, "stdin", "surrogate"),
        ({"mounts": []}, OpenArgs, "mounts", "unknown field"),
        ({"sandbox_id": "x", "command": ["a"]}, ExecArgs, "sandbox_id", "not a sandbox id"),
        ({"sandbox_id": SANDBOX_ID, "command": ["a"], "cwd": "rel"}, ExecArgs, "cwd", "absolute"),
        ({"sandbox_id": SANDBOX_ID, "command": ["a"], "cwd": "/proc/1"}, ExecArgs, "cwd", "/proc"),
        (
            {"sandbox_id": SANDBOX_ID, "path": "a", "encoding": "latin-1"},
            ReadFileArgs,
            "encoding",
            "Invalid enum value",
        ),
        ({"sandbox_id": SANDBOX_ID, "path": "a"}, WriteFileArgs, "content", "required"),
    ],
)
def test_bad_arguments_name_the_field_and_the_rule(
    arguments: dict[str, Any], kind: type[Any], field: str, rule: str
) -> None:
    error = refused(decode_args, arguments, kind)
    assert (error.field, rule in error.rule) == (field, True), error


def test_arguments_that_are_not_an_object_are_refused() -> None:
    error = refused(decode_args, ["ls"], RunArgs)  # type: ignore[arg-type]
    assert error.field == "arguments"


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("../etc/passwd", "'..'"),
        ("/etc/passwd", "outside"),
        ("/tmp/", "itself"),
        (".", "itself"),
        ("a\nb", "control"),
    ],
)
def test_file_paths_stay_under_tmp(path: str, rule: str) -> None:
    error = refused(file_path, path)
    assert error.field == "path"
    assert rule in error.rule


def test_file_paths_relative_or_absolute_under_tmp() -> None:
    assert file_path("src/main.py") == file_path("/tmp/src/main.py") == "src/main.py"


def test_content_is_text_or_base64_within_the_cap() -> None:
    assert content_bytes("héllo", "utf-8", 10) == "héllo".encode()
    assert content_bytes(base64.b64encode(b"\xff\x00").decode(), "base64", 10) == b"\xff\x00"
    assert refused(content_bytes, "not base64!", "base64", 10).field == "content"
    assert "at most 4" in refused(content_bytes, "hello", "utf-8", 4).rule


# --- the operator's ceilings --------------------------------------------------------------------


def run_args(**fields: Any) -> RunArgs:
    return decode_args({"command": ["true"], **fields}, RunArgs)


@pytest.mark.parametrize("name", list(LIMIT_FIELDS))
def test_a_call_may_lower_every_limit(policy: McpPolicy, name: str) -> None:
    field, is_size = LIMIT_FIELDS[name]
    ceiling = getattr(policy.ceilings, field)
    lower = ceiling // 2 if is_size or name == "pids" else ceiling / 2
    spec = run_request(policy, run_args(limits={name: lower})).spec
    assert getattr(spec.limits, field) == lower


@pytest.mark.parametrize("name", list(LIMIT_FIELDS))
def test_a_call_never_raises_a_limit(policy: McpPolicy, name: str) -> None:
    field, _ = LIMIT_FIELDS[name]
    higher = getattr(policy.ceilings, field) * 2
    error = refused(run_request, policy, run_args(limits={name: higher}))
    assert error.field == f"limits.{name}"
    assert "may lower the operator's limit" in error.rule
    assert "never raise it" in error.rule


def test_sizes_are_read_as_everywhere(policy: McpPolicy) -> None:
    spec = run_request(policy, run_args(limits={"memory": "128m", "max_output": "1k"})).spec
    assert (spec.limits.memory_bytes, spec.limits.output_bytes) == (128 * MiB, 1024)
    assert refused(run_request, policy, run_args(limits={"memory": 0})).field == "limits.memory"
    assert refused(run_request, policy, run_args(limits={"timeout": -1})).field == "limits.timeout"


def test_images_come_from_the_allow_list(policy: McpPolicy) -> None:
    assert run_request(policy, run_args()).spec.image == PYTHON
    assert run_request(policy, run_args(image=BUSYBOX)).spec.image == BUSYBOX
    error = refused(run_request, policy, run_args(image="alpine:latest"))
    assert error.field == "image"
    assert PYTHON in error.rule
    assert BUSYBOX in error.rule


def test_a_call_adds_env_but_never_changes_the_operators(policy: McpPolicy) -> None:
    spec = run_request(policy, run_args(env={"MINE": "1"})).spec
    assert spec.env == {"OPERATOR": "set", "MINE": "1"}
    error = refused(run_request, policy, run_args(env={"OPERATOR": "mine"}))
    assert error.field == "env['OPERATOR']"


def test_stdin_and_files_are_capped(policy: McpPolicy) -> None:
    assert refused(run_request, policy, run_args(stdin="x" * 1025)).field == "stdin"
    assert refused(run_request, policy, run_args(files={"a": "x" * 600, "b": "y" * 600})).field == (
        "files"
    )
    many = {f"f{i}": "" for i in range(MAX_RUN_FILES + 1)}
    assert refused(run_request, policy, run_args(files=many)).field == "files"
    assert refused(run_request, policy, run_args(files={"../x": ""})).field == "files['../x']"
    assert refused(run_request, policy, run_args(files={"/etc/x": ""})).field == "files['/etc/x']"


def test_a_sandbox_lives_no_longer_than_the_operator_allows(policy: McpPolicy) -> None:
    opened = open_request(policy, decode_args({"lifetime": 60, "limits": {"timeout": 5}}, OpenArgs))
    assert opened.spec.limits.timeout_s == 60  # the session's lifetime
    assert opened.command_limits.timeout_s == 5  # each command's
    default = open_request(policy, decode_args({}, OpenArgs))
    assert default.lifetime_s == 600
    error = refused(open_request, policy, decode_args({"lifetime": 601}, OpenArgs))
    assert (error.field, "never lengthen" in error.rule) == ("lifetime", True)


def test_an_exec_lowers_its_sandboxs_limits(policy: McpPolicy) -> None:
    limits = open_request(policy, decode_args({"limits": {"timeout": 5}}, OpenArgs)).command_limits

    def exec_args(**fields: Any) -> ExecArgs:
        return decode_args({"sandbox_id": SANDBOX_ID, "command": ["true"], **fields}, ExecArgs)

    request = exec_request(policy, limits, exec_args(timeout=2, max_output="1k"))
    assert (request.timeout_s, request.max_output) == (2, 1024)
    assert exec_request(policy, limits, exec_args()).timeout_s == 5
    error = refused(exec_request, policy, limits, exec_args(timeout=6))
    assert (error.field, "this sandbox's limit of 5 s" in error.rule) == ("timeout", True)
    assert refused(exec_request, policy, limits, exec_args(max_output="1m")).field == "max_output"
    assert refused(exec_request, policy, limits, exec_args(env={"OPERATOR": "x"})).field == (
        "env['OPERATOR']"
    )


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
ANY_FIELD = st.sampled_from(
    [
        "command",
        "stdin",
        "files",
        "image",
        "limits",
        "env",
        "user",
        "network",
        "mounts",
        "runtime",
        "privileged",
        "labels",
        "workdir",
        "cap_add",
        "extra_flags",
    ]
)
LIMITS = st.dictionaries(st.sampled_from(list(LIMIT_FIELDS)), JSONISH | st.integers(1, 2**40))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(ANY_FIELD, JSONISH, max_size=6),
    st.one_of(st.none(), LIMITS),
    st.sampled_from([None, PYTHON, BUSYBOX, "alpine:3"]),
)
def test_no_argument_weakens_the_hardening(
    policy: McpPolicy, fields: dict[str, Any], limits: dict[str, Any] | None, image: str | None
) -> None:
    """Whatever a model sends, a spec comes out only as the profile's with a command, an
    allowed image, lower limits and added env — or a SpecError; nothing else."""
    arguments: dict[str, Any] = {"command": ["sh", "-c", "true"], **fields}
    if limits is not None:
        arguments["limits"] = limits
    if image is not None:
        arguments["image"] = image
    try:
        spec = run_request(policy, decode_args(arguments, RunArgs)).spec
    except SpecError:
        return
    base = policy.base
    for name in (
        "user",
        "network",
        "runtime",
        "mounts",
        "labels",
        "extra_flags",
        "gpus",
        "workdir",
    ):
        assert getattr(spec, name) == getattr(base, name), name
    assert spec.image in policy.images
    for field, _ in LIMIT_FIELDS.values():
        assert getattr(spec.limits, field) <= getattr(base.limits, field), field
    assert {key: spec.env[key] for key in base.env} == base.env


# --- the tools as listed -----------------------------------------------------------------------


def test_each_tools_schema_lists_exactly_its_arguments(policy: McpPolicy) -> None:
    tools = {tool["name"]: tool for tool in tool_definitions(policy)}
    assert list(tools) == list(ARGS)
    for name, kind in ARGS.items():
        schema = tools[name]["inputSchema"]
        assert schema["additionalProperties"] is False
        assert set(schema["properties"]) == set(kind.__struct_fields__), name
        required = {
            field
            for field, default in zip(
                kind.__struct_fields__,
                (msgspec.NODEFAULT,) * (len(kind.__struct_fields__) - len(kind.__struct_defaults__))
                + kind.__struct_defaults__,
                strict=True,
            )
            if default is msgspec.NODEFAULT
        }
        assert set(schema["required"]) == required, name
        assert tools[name]["description"], name
        assert tools[name]["outputSchema"]["type"] == "object", name


def test_descriptions_state_this_servers_sandbox(policy: McpPolicy) -> None:
    tools = {tool["name"]: tool for tool in tool_definitions(policy)}
    run = tools["run"]
    assert "no network" in run["description"]
    assert "/data (read-only)" in run["description"]
    assert "/tmp (32 MiB)" in run["description"]
    limits = run["inputSchema"]["properties"]["limits"]["properties"]
    assert set(limits) == set(LIMIT_FIELDS)
    assert "At most 256 MiB" in limits["memory"]["description"]
    assert limits["cpus"]["maximum"] == 1
    assert run["inputSchema"]["properties"]["image"]["enum"] == [PYTHON, BUSYBOX]
    assert "60 s without a call" in tools["sandbox_open"]["description"]


def validator_of(schema: dict[str, Any]) -> Any:
    validator = jsonschema.validators.validator_for(schema, jsonschema.Draft202012Validator)
    validator.check_schema(schema)
    return validator(schema)


RESULTS: dict[str, dict[str, Any]] = {
    "run": {
        "status": "exited",
        "exit_code": 0,
        "stdout": "hi\n",
        "stderr": "",
        "stdout_bytes": 3,
        "stderr_bytes": 0,
        "overflowed": None,
        "evidence": {"oom": None, "kill": None, "witness": "kernel"},
        "duration_s": 0.5,
        "denials": [
            {"destination": "evil.example:443", "reason": "not allowed", "kind": "request"}
        ],
    },
    "sandbox_open": {
        "sandbox_id": SANDBOX_ID,
        "image": PYTHON,
        "workdir": "/tmp",
        "files_root": "/tmp",
        "limits": {"cpus": 1.0},
        "lifetime_s": 60.0,
        "expires_in_s": 59.0,
        "idle_timeout_s": 60.0,
        "idle_s": 0.0,
        "busy": False,
        "ports": [{"address": "127.0.0.1", "host_port": 40123, "sandbox_port": 8000}],
    },
    "sandbox_write_file": {"sandbox_id": SANDBOX_ID, "path": "/tmp/x", "bytes": 1},
    "sandbox_read_file": {
        "sandbox_id": SANDBOX_ID,
        "path": "/tmp/x",
        "content": "x",
        "encoding": "utf-8",
        "bytes": 1,
    },
    "sandbox_close": {"sandbox_id": SANDBOX_ID, "closed": True},
    "sandbox_list": {"sandboxes": [], "open_or_running": 0, "max_per_client": 2},
}
RESULTS["sandbox_exec"] = RESULTS["run"]
PROCESS_ID = "p" + "0" * 16
PROCESS_EXIT = {
    "status": "killed",
    "exit_code": None,
    "output_bytes": 3,
    "duration_s": 1.5,
    "evidence": {"oom": None, "kill": "sbxkit killed it on the caller's request (kill())"},
}
RESULTS["process_start"] = {
    "sandbox_id": SANDBOX_ID,
    "process_id": PROCESS_ID,
    "command": ["sh", "-c", "sh -i"],
    "pty": False,
    "running": True,
    "output_bytes": 0,
    "exit": None,
}
RESULTS["process_signal"] = RESULTS["process_start"]
RESULTS["process_kill"] = {**RESULTS["process_start"], "running": False, "exit": PROCESS_EXIT}
RESULTS["process_write"] = {
    "sandbox_id": SANDBOX_ID,
    "process_id": PROCESS_ID,
    "bytes": 3,
    "stdin_closed": False,
}
RESULTS["process_read"] = {
    "sandbox_id": SANDBOX_ID,
    "process_id": PROCESS_ID,
    "output": "hi\n",
    "encoding": "utf-8",
    "cursor": 0,
    "next_cursor": 3,
    "bytes": 3,
    "done": True,
    "running": False,
    "exit": PROCESS_EXIT,
}
RESULTS["process_list"] = {
    "sandbox_id": SANDBOX_ID,
    "processes": [RESULTS["process_kill"]],
    "running": 0,
    "max_processes": 4,
}
RESULTS["python"] = python_fields(
    CodeResult(
        status="error",
        stdout="hi\n",
        text=None,
        data={"image/png": "iVBORw0KGgo=", "text/html": "<b>1</b>"},
        error=CodeError("ZeroDivisionError", "division by zero", "Traceback …"),
        run_s=0.25,
    ),
    fresh=True,
    ports=(PortForward(host_port=40123, sandbox_port=8000),),
)


def test_output_schemas_admit_each_result_and_each_error(policy: McpPolicy) -> None:
    """What a strict client checks of every result, an error result included (the MCP
    Inspector does): the result's shape, or ``{"error": …}``, never a mixture."""
    errors = [
        error_fields(SpecError("limits.memory", "never raise it")),
        error_fields(SbxError("boom")),
        error_fields(QuotaExhausted("mcp.max_sandboxes", "the server holds 16")),
    ]
    for tool in tool_definitions(policy):
        validator = validator_of(tool["outputSchema"])
        result = RESULTS[tool["name"]]
        validator.validate(result)
        for error in errors:
            validator.validate(error)
        wrong = [
            {},
            {**result, **errors[0]},  # a result with an error in it
            {"error": {**errors[0]["error"], "message": None}},
            {"error": {"type": "SpecError"}},
            {key: value for key, value in result.items() if key != next(iter(result))},
        ]
        for instance in wrong:
            assert not validator.is_valid(instance), (tool["name"], instance)


def test_annotations_say_what_each_tool_can_change(policy: McpPolicy) -> None:
    """With no network and a read-only mount a command changes nothing past its sandbox;
    a writable mount makes commands destructive, a network makes them open-world too."""

    def hints(profile: str) -> dict[str, tuple[bool, bool, bool, bool]]:
        keys = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
        return {
            tool["name"]: tuple(tool["annotations"][key] for key in keys)
            for tool in tool_definitions(policy_from_profile(decode_profile(profile)))
        }

    closed = hints(PROFILE)
    assert closed["run"] == (False, False, True, False)
    assert closed["sandbox_exec"] == (False, True, False, False)
    assert closed["sandbox_read_file"][0]
    assert closed["sandbox_list"][0]
    assert not any(hint[3] for hint in closed.values())
    writable = hints(PROFILE.replace('target = "/data"', 'target = "/data"\nread_only = false'))
    assert writable["run"] == (False, True, False, False)
    assert writable["sandbox_exec"] == (False, True, False, False)
    networked = hints(
        PROFILE.replace("enable_bind_mounts", 'network = "bridge"\nenable_bind_mounts')
    )
    assert networked["run"] == (False, True, False, True)
    assert networked["sandbox_exec"] == (False, True, False, True)
    assert networked["sandbox_open"][3] is False
    for tool in tool_definitions(policy):
        assert tool["title"] == tool["annotations"]["title"]


# --- quotas, addresses, errors -------------------------------------------------------------------


def test_quotas_per_client_and_in_all() -> None:
    quotas = Quotas(per_client=2, in_all=3)
    quotas.take("a")
    quotas.take("a")
    with pytest.raises(QuotaExhausted) as caught:
        quotas.take("a")
    assert caught.value.field == "mcp.max_sandboxes_per_client"
    quotas.take("b")
    with pytest.raises(QuotaExhausted) as caught:
        quotas.take("c")
    assert caught.value.field == "mcp.max_sandboxes"
    quotas.give("a")
    quotas.take("c")
    assert (quotas.held("a"), quotas.held("c"), quotas.held()) == (1, 1, 3)
    with pytest.raises(AssertionError):
        quotas.give("nobody")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8765", ("127.0.0.1", 8765)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("[::1]:8765", ("::1", 8765)),
        ("127.1.2.3:1", ("127.1.2.3", 1)),
    ],
)
def test_http_listens_on_loopback(text: str, expected: tuple[str, int]) -> None:
    assert parse_http_address(text) == expected


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("0.0.0.0:8765", "0.0.0.0 is not a loopback address"),
        ("192.168.1.10:8765", "192.168.1.10 is not a loopback address"),
        ("[::]:8765", ":: is not a loopback address"),
        ("localhost:8765", "'localhost' is not an IP address"),
        ("example.com:80", "'example.com' is not an IP address"),
        ("127.0.0.1", "expected HOST:PORT"),
        ("127.0.0.1:99999", "port"),
        ("127.0.0.1:-1", "port"),
    ],
)
def test_http_refuses_any_other_address_by_name(text: str, rule: str) -> None:
    error = refused(parse_http_address, text)
    assert error.field == "--http"
    assert rule in error.rule


def test_error_fields_name_the_field_and_rule() -> None:
    fields = error_fields(SpecError("limits.memory", "never raise it"))["error"]
    assert fields == {
        "type": "SpecError",
        "field": "limits.memory",
        "rule": "never raise it",
        "message": "limits.memory: never raise it",
    }
    plain = error_fields(SbxError("boom"))["error"]
    assert (plain["field"], plain["rule"], plain["message"]) == (None, None, "boom")


def test_a_governed_network_is_described_in_words_not_a_repr() -> None:
    from sbxkit._model.network_terms import Network
    from sbxkit.mcp.schemas import network_phrase

    said = network_phrase(
        Network(allow=["pypi.org:443", "*.example.com"], callback="http://127.0.0.1:8080")
    )
    assert said == (
        "no network except, through sbxkit's proxy, pypi.org:443, *.example.com; "
        "a host endpoint http://127.0.0.1:8080 as $SBXKIT_ENDPOINT"
    )
    assert "Network(" not in said
    assert network_phrase("none") == "no network"


def test_a_profiles_inject_rules_and_ports_are_said_to_the_model() -> None:
    from sbxkit._model.network_inject import InjectRule
    from sbxkit._model.network_terms import Network
    from sbxkit.mcp.schemas import network_phrase

    said = network_phrase(
        Network(
            allow=["api.example.com:443"],
            inject=[InjectRule(host="api.example.com", header="Authorization", value_from="env:T")],
            ports=[8000, "18001:8001"],
        )
    )
    assert said == (
        "no network except, through sbxkit's proxy, api.example.com:443; the proxy adds the "
        "credentials for api.example.com: call them without a key; inbound ports 8000, "
        "18001:8001 forwarded from the host to the sandbox's 127.0.0.1 (the result's ports name "
        "the host's side)"
    )
    assert "env:T" not in said


def test_a_python_answer_says_its_forwarded_ports_in_text_and_json() -> None:
    result = CodeResult(status="ok", stdout="", text="1", run_s=0.1)
    port = PortForward(host_port=40123, sandbox_port=8000)
    assert python_parts(result, timeout_s=5, ports=(port,)) == [
        ("text", "1"),
        ("text", "forwarded ports (host->sandbox 127.0.0.1): 127.0.0.1:40123->8000"),
    ]
    assert python_parts(result, timeout_s=5) == [("text", "1")]
    fields = python_fields(result, fresh=False, ports=(port,))
    assert fields["ports"] == [{"address": "127.0.0.1", "host_port": 40123, "sandbox_port": 8000}]
