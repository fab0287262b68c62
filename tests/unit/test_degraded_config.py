"""The `health.degraded` section of the config: defaults, values, and mistakes refused."""

from __future__ import annotations

import pytest

from agents.config import Degraded, parse_config
from agents.core.degraded import Limits
from agents.errors import ConfigError


def test_defaults_when_absent() -> None:
    degraded = parse_config("", "c.yaml").health.degraded
    assert degraded == Degraded("healthy", 60, 0, 10)
    assert degraded.limits == Limits(60.0, 0, 10)


def test_every_key_is_read() -> None:
    text = """
health:
  degraded: {report: unhealthy, holdS: 300, nicSpeedMbps: 400000, rdmaErrorsPerMinute: 0}
"""
    degraded = parse_config(text, "c.yaml").health.degraded
    assert degraded == Degraded("unhealthy", 300, 400000, 0)
    assert degraded.limits == Limits(300.0, 400000, 0)


def test_null_section_means_defaults() -> None:
    assert parse_config("health: {degraded: null}", "c.yaml").health.degraded == Degraded()


@pytest.mark.parametrize(
    ("body", "key"),
    [
        pytest.param("report: sick", "health.degraded.report", id="report-unknown-word"),
        pytest.param("report: true", "health.degraded.report", id="report-boolean"),
        pytest.param("holdS: -1", "health.degraded.holdS", id="hold-negative"),
        pytest.param("holdS: 1.5", "health.degraded.holdS", id="hold-fraction"),
        pytest.param("holdS: 60s", "health.degraded.holdS", id="hold-duration-text"),
        pytest.param("holdS: 86401", "health.degraded.holdS", id="hold-over-a-day"),
        pytest.param("nicSpeedMbps: -100", "health.degraded.nicSpeedMbps", id="speed-negative"),
        pytest.param("nicSpeedMbps: fast", "health.degraded.nicSpeedMbps", id="speed-text"),
        pytest.param(
            "rdmaErrorsPerMinute: -1", "health.degraded.rdmaErrorsPerMinute", id="errors-negative"
        ),
        pytest.param(
            "rdmaErrorsPerMinute: false",
            "health.degraded.rdmaErrorsPerMinute",
            id="errors-boolean",
        ),
        pytest.param("hold: 60", "health.degraded.hold", id="unknown-key"),
    ],
)
def test_mistakes_are_config_errors_naming_the_key(body: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(f"health:\n  degraded: {{{body}}}\n", "c.yaml")
    assert key in str(err.value)


def test_degraded_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match=r"health\.degraded"):
        parse_config("health: {degraded: [1]}", "c.yaml")
