"""Which named config a node runs: the one its label names, else the default, as NVIDIA's
config manager chooses among the files of a mounted ConfigMap; a name that names no
config keeps the one running."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DEFAULT_LABEL = "nvidia.com/device-plugin.config"  # NVIDIA's: its nodes' labels carry over
BUILT_IN = ""  # no file: the built-in defaults, run where no config is named
FALLBACK_NAME = "default"  # without a default name, a config of this name is the default
SUFFIX = ".yaml"


def config_files(entries: Iterable[str]) -> dict[str, str]:
    """Config name -> file name, for the entries of a config directory: a file is named by
    itself and, if it ends in .yaml, without it too (a ConfigMap's keys are file names);
    hidden entries (a mounted ConfigMap's `..data`) are none. An exact file name wins."""
    files = [e for e in entries if not e.startswith(".")]
    named = {f.removesuffix(SUFFIX): f for f in files if f.endswith(SUFFIX) and f != SUFFIX}
    return named | {f: f for f in files}


def names(files: Mapping[str, str]) -> list[str]:
    """The configs' names as an operator writes them in a label: `ts4` for `ts4.yaml`."""
    return sorted({f.removesuffix(SUFFIX) if f != SUFFIX else f for f in files.values()})


def default_name(default: str | None, files: Mapping[str, str]) -> str:
    """The config run without a label: `default`, else NVIDIA's fallbacks (a config named
    `default`, else the only config there is), else the built-in defaults."""
    if default is not None:
        return default
    if FALLBACK_NAME in files:
        return FALLBACK_NAME
    return names(files)[0] if len(set(files.values())) == 1 else BUILT_IN


@dataclass(frozen=True)
class Choice:
    """The config to run (None: none can be), and the name wanted but not found, if any."""

    name: str | None
    missing: str | None = None
    by_label: bool = False  # the missing name came from the label, not from the default


def choose(
    label: str | None, files: Mapping[str, str], default: str | None, current: str | None
) -> Choice:
    """The config for a node whose label says `label` (None or "": no label), among
    `files` (from config_files), with `--config-default` `default`, running `current`
    (None at start). A name that names no config keeps `current`; at start, the default."""
    fallback = default_name(default, files)
    found = fallback == BUILT_IN or fallback in files
    if label:
        if label in files:
            return Choice(label)
        kept = fallback if current is None and found else current
        return Choice(kept, missing=label, by_label=True)
    return Choice(fallback) if found else Choice(current, missing=fallback)
