"""Random config documents and node files: parse_config / parse_node return a value or
raise ConfigError, never anything else."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from agents.config import Config, parse_config
from agents.errors import ConfigError
from agents.sim.bundled import bundled_node
from agents.sim.node import parse_node
from agents.sim.specs import NodeSpec
from tests.fuzz.fuzzing import FUZZ

pytestmark = pytest.mark.fuzz

CONFIG_KEYS = [
    "version",
    "flags",
    "sharing",
    "roce",
    "pairing",
    "health",
    "migStrategy",
    "failOnInitError",
    "deviceIDStrategy",
    "deviceListStrategy",
    "passDeviceSpecs",
    "timeSlicing",
    "renameByDefault",
    "failRequestsGreaterThanOne",
    "resources",
    "name",
    "replicas",
    "resourceName",
    "selectors",
    "vendors",
    "ifNames",
    "linkLayers",
    "enabled",
    "disabledXids",
    "plugin",
    "mps",
    "devices",
    "nvidiaDriverRoot",
]
NODE_KEYS = [
    "numaNodes",
    "gpus",
    "nics",
    "uuid",
    "pci",
    "upstream",
    "numa",
    "model",
    "memoryMiB",
    "minor",
    "nvlinks",
    "mig",
    "enabled",
    "instances",
    "profile",
    "xids",
    "lost",
    "netdev",
    "rdma",
    "vendor",
    "linkLayer",
    "link",
    "uverbs",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(
        [
            "v1",
            "none",
            "single",
            "mixed",
            "uuid",
            "index",
            "envvar",
            "cdi-cri",
            "nvidia.com/gpu",
            "rdma/roce",
            "15b3",
            "Ethernet",
            "InfiniBand",
            "up",
            "down",
            "GPU-1",
            "MIG-1",
            "1g.10gb",
            "0000:1b:00.0",
            "mlx5_0",
            "ens1np0",
            "",
            "-1",
            "0",
            "1e9",
        ]
    ),
)


def documents(keys: list[str]) -> st.SearchStrategy[Any]:
    return st.recursive(
        SCALARS,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(
                st.one_of(st.sampled_from(keys), st.text(max_size=8)), inner, max_size=5
            ),
        ),
        max_leaves=25,
    )


def mutated(doc: Any, keys: list[str]) -> st.SearchStrategy[Any]:
    """A valid document with one subtree replaced by something random."""

    def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        out = [prefix]
        if isinstance(node, dict):
            for k, v in node.items():
                out += paths(v, (*prefix, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                out += paths(v, (*prefix, i))
        return out

    def replace(path: tuple[Any, ...], value: Any) -> Any:
        import copy

        result = copy.deepcopy(doc)
        if not path:
            return value
        node = result
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value
        return result

    return st.builds(replace, st.sampled_from(paths(doc)), documents(keys))


SPEC_CONFIG = yaml.safe_load(
    """
version: v1
flags: {migStrategy: mixed, failOnInitError: true, deviceIDStrategy: uuid,
        deviceListStrategy: [envvar], passDeviceSpecs: false}
sharing:
  timeSlicing:
    renameByDefault: false
    failRequestsGreaterThanOne: false
    resources: [{name: nvidia.com/gpu, replicas: 4}]
roce: {resourceName: rdma/roce, selectors: {vendors: ["15b3"], ifNames: [], linkLayers: [Ethernet]}}
pairing: {enabled: true}
health: {disabledXids: [13]}
"""
)


def parses_config_or_refuses(text: str) -> None:
    try:
        assert isinstance(parse_config(text, "fuzz.yaml"), Config)
    except ConfigError as err:
        assert "fuzz.yaml" in str(err)


def parses_node_or_refuses(text: str) -> None:
    try:
        assert isinstance(parse_node(text, "node.yaml"), NodeSpec)
    except ConfigError as err:
        assert "node.yaml" in str(err)


@FUZZ
@given(doc=documents(CONFIG_KEYS))
def test_random_config_documents_parse_or_raise_config_error(doc: Any) -> None:
    parses_config_or_refuses(yaml.safe_dump(doc))


@FUZZ
@given(doc=mutated(SPEC_CONFIG, CONFIG_KEYS))
def test_config_with_one_part_replaced_parses_or_raises_config_error(doc: Any) -> None:
    parses_config_or_refuses(yaml.safe_dump(doc))


@FUZZ
@given(text=st.text(max_size=200))
def test_config_text_that_is_not_yaml_raises_config_error(text: str) -> None:
    parses_config_or_refuses(text)


NODE_DOC = yaml.safe_load(bundled_node("h100-8gpu-4nic").read_text())
NODE_DOC["gpus"][0]["mig"] = {
    "enabled": True,
    "instances": [{"uuid": "MIG-a", "profile": "1g.10gb"}],
}


@FUZZ
@given(doc=mutated(NODE_DOC, NODE_KEYS))
def test_node_file_with_one_part_replaced_parses_or_raises_config_error(doc: Any) -> None:
    parses_node_or_refuses(yaml.safe_dump(doc))


@FUZZ
@given(doc=documents(NODE_KEYS))
def test_random_node_documents_parse_or_raise_config_error(doc: Any) -> None:
    parses_node_or_refuses(yaml.safe_dump(doc))


@FUZZ
@given(text=st.text(max_size=200))
def test_node_text_that_is_not_yaml_raises_config_error(text: str) -> None:
    parses_node_or_refuses(text)
