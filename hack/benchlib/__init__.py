"""The benchmark suite behind `hack/bench`: generated nodes, a subprocess agent, figures."""
