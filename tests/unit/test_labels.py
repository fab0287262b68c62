"""label_value turns any text into a valid Kubernetes label value, and the families name
only valid label keys, each its own."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.config import Config
from agents.core.topology import pairs_label
from agents.gpu.family import GpuFamily
from agents.gpu.found import GpusFound
from agents.hw.sysfs import Sysfs
from agents.labels import PREFIX, label_value, prefixed
from agents.roce.family import NicsFound, RoceFamily

# The apimachinery rule for label values: empty, or at most 63 characters of
# [A-Za-z0-9._-] that begin and end with an alphanumeric.
VALID_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# A label key's name part: the same alphabet and ends, at most 63 characters.
VALID_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("Tesla V100 (PCIe) 16GB", "Tesla-V100-PCIe-16GB"),
        ("NVIDIA RTX 6000 Ada Generation", "NVIDIA-RTX-6000-Ada-Generation"),
        ("  leading and trailing  ", "leading-and-trailing"),
        ("-._edges._-", "edges"),
        ("a/b:c@d", "a-b-c-d"),
        ("GPU_1.5", "GPU_1.5"),
        ("Grafikkarte \u00fcber alles", "Grafikkarte-ber-alles"),
        ("", ""),
        ("!!!", ""),
        ("x" * 80, "x" * 63),
        ("a" * 62 + " b", "a" * 62),
        ("a" * 61 + "._b", "a" * 61),
    ],
    ids=[
        "h100",
        "a100-already-valid",
        "parentheses",
        "long-product-name",
        "outer-spaces",
        "outer-punctuation",
        "slash-colon-at",
        "underscore-and-dot-kept",
        "non-ascii",
        "empty",
        "nothing-valid",
        "truncated-to-63",
        "truncation-never-ends-in-dash",
        "truncation-never-ends-in-dot-or-underscore",
    ],
)
def test_label_value_is_the_nearest_valid_value(text: str, expected: str) -> None:
    assert label_value(text) == expected
    assert VALID_VALUE.match(label_value(text))


@given(st.text())
def test_label_value_is_valid_for_any_text(text: str) -> None:
    value = label_value(text)
    assert len(value) <= 63
    assert VALID_VALUE.match(value), value


def _empty_families() -> dict[str, dict[str, str]]:
    """The labels of each family built from a discovery that found nothing."""
    config = Config.default()
    gpu = GpuFamily(Uninitialised(), GpusFound((), (), {}, "", held=False), config)
    roce = RoceFamily(Sysfs(Path("/nonexistent")), Unread(), NicsFound((), {}), config)
    return {"gpu": gpu.labels(), "roce": roce.labels(), "pairs": pairs_label({}, {})}


def test_node_labels_without_devices_are_valid_and_say_so() -> None:
    families = _empty_families()
    labels = prefixed(families["gpu"] | families["roce"] | families["pairs"])
    assert labels == {
        PREFIX + "gpu-nic.pairs": "false",
        PREFIX + "gpu.count": "0",
        PREFIX + "gpu.healthy": "0",
        PREFIX + "roce.count": "0",
        PREFIX + "roce.healthy": "0",
    }
    for key, value in labels.items():
        prefix, _, name = key.partition("/")
        assert prefix == PREFIX.rstrip("/")
        assert VALID_NAME.match(name), key
        assert VALID_VALUE.match(value), value


def test_each_family_labels_only_its_own_devices() -> None:
    families = _empty_families()
    assert all(name.startswith("gpu.") for name in families["gpu"])
    assert all(name.startswith("roce.") for name in families["roce"])
    assert set(families["pairs"]) == {"gpu-nic.pairs"}


class Uninitialised:
    """NVML that nobody may call: a family built from an empty discovery asks nothing."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"NVML {name} called")


class Unread:
    """Links that nobody may read, likewise."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"links {name} called")


def test_labels_with_a_prefix_of_their_own_keep_it_and_bare_ones_get_ours() -> None:
    labels = prefixed({"roce.count": "2", "network.node-agents.io/leaf-group": "leaf-a.leaf-b"})
    assert labels == {
        "network.node-agents.io/leaf-group": "leaf-a.leaf-b",
        PREFIX + "roce.count": "2",
    }
