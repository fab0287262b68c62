"""node-agents: Kubernetes device-plugin agents for GPUs and RoCE NICs."""

__version__ = "0.1.0"
