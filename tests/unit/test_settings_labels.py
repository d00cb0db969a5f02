"""Settings.labels: an operator's (or a CI job's) labels on every container this process makes."""

from __future__ import annotations

import pytest

from sbxkit._model.settings import Settings
from sbxkit._model.spec import Limits, MiB, SandboxSpec, parse_label_list
from sbxkit._plan.plan import effective_settings
from sbxkit._plan.policy import LEASE_LABEL, build_create_body
from sbxkit.errors import SpecError

SPEC = SandboxSpec(
    image="img:1",
    command=["true"],
    limits=Limits(cpus=1, memory_bytes=64 * MiB, pids=64, output_bytes=MiB, timeout_s=5),
    labels={"team": "evals", "job": "spec's"},
)
LEASE = "a" * 32


def test_sbxkit_labels_are_read_once_by_the_io_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SBXKIT_LABELS", "ci.job=42, job=operator's")
    assert effective_settings(None).labels == {"ci.job": "42", "job": "operator's"}
    explicit = Settings(labels={"x": "1"})
    assert effective_settings(explicit).labels == {"x": "1"}  # explicit settings win
    monkeypatch.delenv("SBXKIT_LABELS")
    assert effective_settings(None).labels == {}


def test_settings_labels_win_over_the_spec_and_never_over_the_lease() -> None:
    body = build_create_body(SPEC, LEASE, settings=Settings(labels={"job": "operator's"}))
    assert body.labels == {"team": "evals", "job": "operator's", LEASE_LABEL: LEASE}


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("novalue", "expected KEY=VALUE"),
        ("=v", "expected KEY=VALUE"),
        (f"{LEASE_LABEL}=x", "reserved"),
        ("k=a\x85b", "control characters"),
    ],
)
def test_a_bad_label_list_is_refused_naming_the_variable(text: str, rule: str) -> None:
    with pytest.raises(SpecError, match=rule) as caught:
        parse_label_list(text, "SBXKIT_LABELS")
    assert caught.value.field.startswith("SBXKIT_LABELS")
