"""label_value turns any text into a valid Kubernetes label value, and node_labels names
only valid label keys."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.labels import PREFIX, family_labels, label_value, node_labels

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


def test_node_labels_without_devices_are_valid_and_say_so() -> None:
    labels = node_labels([], [], healthy_gpus=0, healthy_nics=0)
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


@pytest.mark.parametrize(
    ("gpu", "roce", "kept"),
    [
        (True, True, {"gpu.count", "roce.count", "gpu-nic.pairs"}),
        (True, False, {"gpu.count"}),
        (False, True, {"roce.count"}),
    ],
    ids=["both", "gpu-only", "roce-only"],
)
def test_an_agent_labels_only_the_families_it_runs(gpu: bool, roce: bool, kept: set[str]) -> None:
    labels = node_labels([], [], healthy_gpus=0, healthy_nics=0)
    names = {k.removeprefix(PREFIX) for k in family_labels(labels, gpu=gpu, roce=roce)}
    assert names & {"gpu.count", "roce.count", "gpu-nic.pairs"} == kept
    assert all(n.startswith(("gpu.", "roce.", "gpu-nic.")) for n in names)
