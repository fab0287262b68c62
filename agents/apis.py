"""The kubelet APIs this agent can serve its families through, by name: the one list to
extend, as agents/families.py is of families. The first is the default."""

from __future__ import annotations

from collections.abc import Sequence

from agents.dra.api import DraApi
from agents.errors import ConfigError
from agents.kernel.runtime import Api
from agents.plugin.api import DevicePluginApi

APIS: tuple[Api, ...] = (DevicePluginApi(), DraApi())


def api_named(name: str, among: Sequence[Api] = APIS) -> Api:
    """The API `--api` names; ConfigError for any other."""
    for api in among:
        if api.name == name:
            return api
    raise ConfigError("--api", name, f"any of {', '.join(a.name for a in among)}")
