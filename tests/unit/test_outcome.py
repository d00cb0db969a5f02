"""A signal exit is OOM or someone else's kill only on the daemon's evidence (pure part)."""

from __future__ import annotations

import pytest

from sbxkit._lifecycle.outcome import (
    Verdict,
    classify_exit,
    docker_time,
    evidence_grace,
    signal_number,
)
from sbxkit.engine.models import Event, EventActor


def event(action: str, **attributes: str) -> Event:
    return Event(type="container", action=action, actor=EventActor(attributes=attributes))


EXITED = Verdict(status="exited")


def test_the_oom_flag_decides_a_signal_exit() -> None:
    assert classify_exit(True, 137) == Verdict(status="oom_killed", oom_evidence="State.OOMKilled")


def test_an_exit_of_its_own_stands_after_a_childs_oom() -> None:
    """Issue 12: the flag says a process in the cgroup was OOM-killed, not which one; a payload
    that exited 5 (or 0) answered by itself, and the OOM is only noted."""
    for code in (0, 5, 128):
        verdict = classify_exit(True, code)
        assert verdict.status == "exited"
        assert verdict.kill_evidence is None
        assert verdict.oom_evidence is not None
        assert f"exited {code} by itself" in verdict.oom_evidence


def test_137_alone_is_an_exit_not_an_oom() -> None:
    assert classify_exit(False, 137) == EXITED  # `exit 137`, or the payload's own kill


def test_an_oom_event_decides_when_the_flag_is_unset() -> None:
    verdict = classify_exit(False, 137, [event("kill", signal="9"), event("oom")])
    assert verdict.status == "oom_killed"
    assert verdict.oom_evidence is not None
    assert "oom event" in verdict.oom_evidence


@pytest.mark.parametrize("spelling", ["9", "KILL", "SIGKILL"])
def test_a_daemon_kill_event_with_the_exit_signal_is_killed(spelling: str) -> None:
    verdict = classify_exit(False, 137, [event("kill", signal=spelling)])
    assert verdict.status == "killed"
    assert verdict.kill_evidence is not None
    assert "SIGKILL" in verdict.kill_evidence
    assert verdict.oom_evidence is None


def test_a_kill_event_for_another_signal_does_not_explain_the_exit() -> None:
    assert classify_exit(False, 137, [event("kill", signal="15")]) == EXITED
    assert classify_exit(False, 143, [event("kill", signal="15")]).status == "killed"


def test_ordinary_exits_ignore_kill_events() -> None:
    assert classify_exit(False, 1, [event("kill", signal="9")]) == EXITED
    assert classify_exit(False, None) == EXITED


def test_docker_time_reads_nanoseconds_and_unset() -> None:
    assert docker_time("1970-01-01T00:00:01.500000000Z") == pytest.approx(1.5)
    assert docker_time("1970-01-01T01:00:00+01:00") == pytest.approx(0.0)
    assert docker_time("0001-01-01T00:00:00Z") is None
    assert docker_time("") is None


def test_signal_number_spellings() -> None:
    assert signal_number("9") == 9
    assert signal_number("term") == 15
    assert signal_number("SIGNOPE") is None
    assert signal_number(None) is None


def test_parse_usage_reads_both_cgroup_versions() -> None:
    from sbxkit._lifecycle.usage import parse_usage

    v1 = parse_usage("v1\n3788800\n54468007\n")
    assert (v1.cgroup, v1.memory_peak_bytes) == ("v1", 3788800)
    assert v1.cpu_time_s == pytest.approx(0.054468007)
    v2 = parse_usage("v2\n-\n1500\n")
    assert (v2.cgroup, v2.memory_peak_bytes) == ("v2", None)  # memory.peak needs Linux 5.19
    assert v2.cpu_time_s == pytest.approx(0.0015)
    assert parse_usage("") == parse_usage("v1\n-\n-\n")


@pytest.mark.parametrize(
    ("round_trip_s", "grace_s"),
    [(0.0, 1.0), (0.002, 1.0), (0.02, 1.0), (0.06, 3.0), (0.1, 5.0), (1.0, 10.0), (-1.0, 1.0)],
)
def test_the_evidence_grace_follows_a_slow_daemon(round_trip_s: float, grace_s: float) -> None:
    """1 s where the daemon answers in milliseconds; 50 round trips where it answers slowly
    (an emulated CPU: its oom event comes late alike); never past 10 s."""
    assert evidence_grace(round_trip_s) == pytest.approx(grace_s)
