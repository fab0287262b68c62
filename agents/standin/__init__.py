"""The kubelet stand-in: a kubelet-like client for tests, demos and benchmarks."""
