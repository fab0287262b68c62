"""Which named config a node runs: the label's, else the default (or NVIDIA's fallbacks);
a name that names no config keeps the running one, and at start the default."""

from __future__ import annotations

import pytest

from agents.core.config_choice import BUILT_IN, Choice, choose, config_files, default_name, names

FILES = config_files(["default", "ts4.yaml", "mig-mixed"])


@pytest.mark.parametrize(
    ("label", "default", "current", "expected"),
    [
        ("ts4", "default", "default", Choice("ts4")),
        ("ts4", "default", None, Choice("ts4")),
        ("mig-mixed", None, "ts4", Choice("mig-mixed")),
        (None, "default", "ts4", Choice("default")),
        ("", "default", "ts4", Choice("default")),
        (None, "mig-mixed", None, Choice("mig-mixed")),
        ("ts8", "default", "ts4", Choice("ts4", missing="ts8", by_label=True)),
        ("ts8", "default", None, Choice("default", missing="ts8", by_label=True)),
        ("ts8", None, None, Choice("default", missing="ts8", by_label=True)),
        (None, "gone", "ts4", Choice("ts4", missing="gone")),
        (None, "gone", None, Choice(None, missing="gone")),
        ("ts8", "gone", None, Choice(None, missing="ts8", by_label=True)),
    ],
    ids=[
        "label-names-a-config",
        "label-at-start",
        "label-without-default",
        "no-label-runs-the-default",
        "empty-label-is-no-label",
        "no-label-at-start",
        "unknown-label-keeps-the-running-config",
        "unknown-label-at-start-runs-the-default",
        "unknown-label-at-start-runs-the-config-named-default",
        "default-missing-keeps-the-running-config",
        "default-missing-at-start-runs-nothing",
        "unknown-label-and-default-missing-at-start-runs-nothing",
    ],
)
def test_the_label_chooses_else_the_default_and_an_unknown_name_keeps_the_running_config(
    label: str | None, default: str | None, current: str | None, expected: Choice
) -> None:
    assert choose(label, FILES, default, current) == expected


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        (["default", "ts4"], "default"),
        (["default.yaml", "ts4"], "default"),
        (["ts4.yaml"], "ts4"),
        (["ts4", "ts4.yaml"], BUILT_IN),
        (["ts4", "ts8"], BUILT_IN),
        ([], BUILT_IN),
    ],
    ids=["named-default", "named-default-yaml", "the-only-one", "two-files", "two", "none"],
)
def test_without_a_default_name_nvidias_fallbacks_then_the_built_in_defaults(
    entries: list[str], expected: str
) -> None:
    assert default_name(None, config_files(entries)) == expected


def test_without_a_label_or_any_config_the_built_in_defaults_run() -> None:
    assert choose(None, config_files([]), None, None) == Choice(BUILT_IN)


def test_a_mounted_configmaps_hidden_entries_are_no_configs_and_yaml_names_drop_the_suffix() -> (
    None
):
    entries = ["..data", "..2025_01_01_00_00_00.1", ".swp", "ts4.yaml", "default", ".yaml"]
    files = config_files(entries)
    assert files == {"ts4": "ts4.yaml", "ts4.yaml": "ts4.yaml", "default": "default"}
    assert names(files) == ["default", "ts4"]


def test_an_exact_file_name_wins_over_the_same_name_with_yaml() -> None:
    files = config_files(["ts4", "ts4.yaml"])
    assert files["ts4"] == "ts4"
    assert files["ts4.yaml"] == "ts4.yaml"
