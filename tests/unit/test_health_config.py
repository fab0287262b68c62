"""The `health` section of the config: disabled XIDs and the opt-in XID recovery period."""

from __future__ import annotations

import pytest

from agents.config import parse_config
from agents.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "recovery"),
    [
        pytest.param("", None, id="default-never"),
        pytest.param("health: {xidRecovery: 0}", None, id="zero-never"),
        pytest.param("health: {xidRecovery: 600}", 600, id="ten-minutes"),
    ],
)
def test_xid_recovery_seconds(text: str, recovery: int | None) -> None:
    assert parse_config(text, "c.yaml").health.xid_recovery_s == recovery


@pytest.mark.parametrize("value", ["-1", "ten", "true", "1.5"])
def test_xid_recovery_must_be_whole_seconds(value: str) -> None:
    with pytest.raises(ConfigError, match="xidRecovery"):
        parse_config(f"health: {{xidRecovery: {value}}}", "c.yaml")
