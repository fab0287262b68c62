"""The corpus covers every key of NVIDIA's v1 config format, and the configuration
reference's table (docs/configuration.md) says for each key what the corpus shows:
honoured, ignored with one warning, or refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.compat.corpus import CASES, CONFIGS, REFUSED, SERVED

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
TABLE_TITLE = "### NVIDIA device-plugin configs"

_REPLICATED = (
    "renameByDefault",
    "failRequestsGreaterThanOne",
    *(f"resources[].{k}" for k in ("name", "replicas", "rename", "devices")),
)
# Every key of the v1 format (api/config/v1 of NVIDIA's k8s-device-plugin, v0.17-v0.20).
NVIDIA_KEYS = {
    "version",
    *(
        f"flags.{k}"
        for k in (
            *("migStrategy", "failOnInitError", "mpsRoot", "nvidiaDriverRoot", "nvidiaDevRoot"),
            *("gdrcopyEnabled", "gdsEnabled", "mofedEnabled", "useNodeFeatureAPI"),
            "deviceDiscoveryStrategy",
        )
    ),
    *(
        f"flags.plugin.{k}"
        for k in (
            *("passDeviceSpecs", "deviceListStrategy", "deviceIDStrategy"),
            *("cdiAnnotationPrefix", "nvidiaCTKPath", "containerDriverRoot"),
            "sharedDevicesAllocationPolicy",
        )
    ),
    *(
        f"flags.gfd.{k}"
        for k in ("oneshot", "noTimestamp", "sleepInterval", "outputFile", "machineTypeFile")
    ),
    *(f"resources.{kind}[].{k}" for kind in ("gpus", "mig") for k in ("pattern", "name")),
    *(f"sharing.{way}.{k}" for way in ("timeSlicing", "mps") for k in _REPLICATED),
    "imex.channelIDs",
    "imex.required",
}
GROUPS = ("honoured", "ignored, one warning", "refused")


def key_paths(node: object, prefix: str = "") -> set[str]:
    """Every key path of a YAML tree, list items as `[]`."""
    if isinstance(node, dict):
        paths = set()
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            paths |= {path} | key_paths(value, path)
        return paths
    if isinstance(node, list):
        return set().union(*(key_paths(item, f"{prefix}[]") for item in node))
    return set()


def corpus_keys(configs: set[Path]) -> set[str]:
    """Every key path used by these configs."""
    return set().union(*(key_paths(yaml.safe_load(p.read_text())) for p in configs))


def reference_table() -> dict[str, str]:
    text = REFERENCE.read_text()
    start = text.index(TABLE_TITLE)
    end = text.find("\n## ", start)
    section = text[start : end if end != -1 else len(text)]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", section, flags=re.MULTILINE)
    return {key: group.strip() for key, group in rows}


def generic(key: str) -> str:
    """A key path as logged or refused, with list indices written `[]`."""
    return re.sub(r"\[[0-9]+\]", "[]", key)


def test_every_config_of_the_corpus_has_a_case_and_every_case_a_config() -> None:
    assert {c.config for c in CASES} == set(CONFIGS.iterdir())


def test_the_corpus_uses_every_key_of_the_v1_format() -> None:
    used = corpus_keys({c.config for c in CASES})
    assert NVIDIA_KEYS - used == set()


def test_the_reference_table_lists_every_key_in_one_of_the_three_groups() -> None:
    table = reference_table()
    assert set(table) == NVIDIA_KEYS
    assert set(table.values()) <= set(GROUPS)


def warned_about(key: str, warned: set[str]) -> bool:
    return any(key == w or key.startswith((w + "[]", w + ".")) for w in warned)


def test_each_group_is_what_the_corpus_shows() -> None:
    """honoured: some served config has the key without a warning about it; ignored:
    some served config has it and a warning names it; refused: a config with it fails."""
    uses = [
        (key_paths(yaml.safe_load(c.config.read_text())), {generic(k) for k in c.ignored})
        for c in SERVED
    ]
    refused = {generic(c.key) for c in REFUSED}
    for key, group in reference_table().items():
        if group == "honoured":
            assert any(key in used and not warned_about(key, w) for used, w in uses), key
        elif group == "ignored, one warning":
            assert any(key in used and warned_about(key, w) for used, w in uses), key
        else:
            assert any(key == r or key.startswith(r + ".") for r in refused), key


def test_the_json_config_is_json() -> None:
    json.loads((CONFIGS / "config-as-json.json").read_text())
