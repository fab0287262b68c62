"""The project's exception tree: every failure the agents report is one of these."""

from __future__ import annotations

from enum import Enum


class AgentError(Exception):
    """Base of every error raised by node-agents."""


class ConfigError(AgentError):
    """A configuration or node file is malformed; `run` exits 2 with this message."""

    def __init__(self, source: str, key: str, expected: str) -> None:
        self.source = source
        self.key = key
        self.expected = expected
        super().__init__(f"{source}: {key}: {expected}")


class BackendError(AgentError):
    """The hardware backend (NVML, sysfs, netlink) failed or is missing."""


class Code(Enum):
    """gRPC status codes an RPC may be refused with (mapped to grpc in plugin/ only)."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    INTERNAL = "INTERNAL"


class AllocationError(AgentError):
    """A GetPreferredAllocation or Allocate request that must be refused."""

    def __init__(self, code: Code, message: str) -> None:
        self.code = code
        super().__init__(message)
