"""node_agent_node_label: the node labels the agent writes (feature file, --label-node),
read at scrape time, so that an alert can see a label such as the leaf group go."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from agents.exposition import Family
from agents.labels import prefixed


class LabelCollector:
    """1 for each label the agent's families want on the node now, by name and value."""

    def __init__(self, labels: Callable[[], Mapping[str, str]]) -> None:
        self._labels = labels

    def collect(self) -> Iterator[Family]:
        family = Family(
            "node_agent_node_label",
            "Each node label the agent writes now, as the node carries it (value 1)",
            ["name", "value"],
        )
        for name, value in prefixed(self._labels()).items():
            family.add([name, value], 1)
        yield family
