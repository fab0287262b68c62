"""node_agent_node_label: the node labels the agent writes (feature file, --label-node),
read at scrape time, so that an alert can see a label such as the leaf group go."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from agents.labels import prefixed


class LabelCollector(Collector):
    """1 for each label the agent's families want on the node now, by name and value."""

    def __init__(self, labels: Callable[[], Mapping[str, str]]) -> None:
        self._labels = labels

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "node_agent_node_label",
            "Each node label the agent writes now, as the node carries it (value 1)",
            labels=["name", "value"],
        )
        for name, value in prefixed(self._labels()).items():
            family.add_metric([name, value], 1)
        yield family
