"""A config per node: a directory of named configs (a mounted ConfigMap), the one named by
this node's label run at start and applied again, on the fly, whenever the label or the
directory changes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from agents.config import Config, parse_config
from agents.core.config_choice import BUILT_IN, Choice, choose, config_files, names
from agents.errors import AgentError, BackendError, ConfigError
from agents.hw.inotify import Change, DirectoryWatch

if TYPE_CHECKING:
    from agents.cluster.client import ApiClient
    from agents.daemon import Agent

log = structlog.get_logger(__name__)

DIR_RETRY_S = 2.0  # how often a directory that cannot be watched is tried again


@dataclass(frozen=True)
class NodeApi:
    """Where this node's label is read: its Node's name and the API server's client."""

    node: str
    client: ApiClient


@dataclass(frozen=True)
class Chosen:
    """A config as read: its name, file (BUILT_IN: none), text and parsed value."""

    name: str
    file: str
    text: str
    config: Config


async def node_api(
    kubeconfig: Path | None, node_name: str | None, env: Mapping[str, str]
) -> NodeApi | None:
    """This node's name and an API client, as the cluster reports find them; None, said
    in one line, when either is missing: the default config runs then."""
    from agents.cluster import api_access, this_node

    node = this_node(node_name, env)
    try:
        access = await api_access(kubeconfig, env) if node else None
    except (AgentError, OSError, ValueError) as exc:
        log.warning("config_label_off", reason=str(exc), effect="the default config")
        return None
    if node is None or access is None:
        why = "no node name" if node is None else "not in a pod and no --kubeconfig"
        log.info("config_label_off", reason=f"no API access: {why}", effect="the default config")
        return None
    from agents.cluster.client import ApiClient

    return NodeApi(node, ApiClient(access))


class NodeConfigs:
    """The named configs in `directory`; `start` chooses one, `run` follows changes."""

    def __init__(
        self, directory: Path, default: str | None, label: str, api: NodeApi | None
    ) -> None:
        self.directory = directory
        self.default = default
        self.label_key = label
        self.api = api
        self.label: str | None = None  # the label's value, as last read
        self.running: Chosen | None = None
        self._refused: tuple[str, str] | None = None  # (file, text) last refused
        self._said: object = None  # the last problem logged, so that it is said once
        self._wake, self._forced = asyncio.Event(), False

    async def aclose(self) -> None:
        if self.api is not None:
            await self.api.client.aclose()

    def source(self, file: str) -> str:
        return str(self.directory / file) if file != BUILT_IN else "<defaults>"

    async def start(self) -> Chosen:
        """The config to start with. Raises ConfigError: a default that names no config,
        a chosen config that is invalid, a directory that cannot be read."""
        await self._read_label()
        files = await asyncio.to_thread(self._files)
        if self.default is not None and self.default not in files:
            raise ConfigError(
                str(self.directory),
                "--config-default",
                f"the name of a config in it ({', '.join(names(files)) or 'none'}), "
                f"got {self.default!r}",
            )
        choice = choose(self.label, files, self.default, None)
        self._say(choice, files)
        assert choice.name is not None  # at start a config is always found: see choose
        file, text = await asyncio.to_thread(self._text, choice.name, files)
        chosen = await asyncio.to_thread(self._parsed, choice.name, file, text)
        self.running = chosen
        log.info(
            "config_chosen",
            config=chosen.name or "<defaults>",
            source=self.source(chosen.file),
            label=self.label_key,
            value=self.label,
        )
        return chosen

    async def _read_label(self) -> None:
        if self.api is None:
            return
        from agents.cluster.client import ApiError, UnreachableError
        from agents.cluster.label_watch import read_label

        try:
            self.label, _ = await read_label(self.api.client, self.api.node, self.label_key)
        except (ApiError, UnreachableError) as exc:
            log.warning(
                "config_label_unread",
                node=self.api.node,
                error=str(exc),
                effect="the default config until the API server answers",
            )

    def _files(self) -> dict[str, str]:
        """Config name -> file name; blocking. Raises ConfigError when unreadable."""
        try:
            entries = [p.name for p in self.directory.iterdir() if p.is_file()]
        except OSError as exc:
            raise ConfigError(str(self.directory), "(directory)", f"readable ({exc})") from exc
        return config_files(entries)

    def _text(self, name: str, files: Mapping[str, str]) -> tuple[str, str]:
        """The named config's file and text; blocking. Raises ConfigError."""
        file = files.get(name, BUILT_IN)
        if file == BUILT_IN:
            return file, ""
        try:
            return file, (self.directory / file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                self.source(file), "(file)", f"a readable UTF-8 file ({exc})"
            ) from exc

    def _parsed(self, name: str, file: str, text: str) -> Chosen:
        """The config in `text`, its ignored keys logged. Raises ConfigError."""
        config = parse_config(text, self.source(file)) if file != BUILT_IN else Config.default()
        for key in config.ignored_keys:
            log.warning(
                "config_key_ignored", key=key, reason="accepted for compatibility, no effect"
            )
        return Chosen(name, file, text, config)

    def _say(self, choice: Choice, files: Mapping[str, str]) -> None:
        """Log once a name that names no config, and what runs instead."""
        problem = (choice.missing, choice.by_label, tuple(names(files)))
        if choice.missing is None or problem == self._said:
            self._said = problem if choice.missing is not None else None
            return
        self._said = problem
        kept = "<defaults>" if choice.name == BUILT_IN else choice.name
        if choice.by_label:
            log.warning(
                "config_label_unknown",
                label=self.label_key,
                value=choice.missing,
                available=names(files),
                kept=kept,
            )
        else:
            log.warning(
                "config_default_missing",
                default=choice.missing,
                available=names(files),
                kept=kept,
            )

    def label_seen(self, value: str | None) -> None:
        """The label's value, as the API server has it now (on the loop)."""
        if value != self.label:
            self.label = value
            self._wake.set()

    def reread(self) -> None:
        """Read the chosen config again, even if nothing seems changed (SIGHUP)."""
        self._forced = True
        self._wake.set()

    async def run(self, agent: Agent, hup: asyncio.Event) -> None:
        """Apply each change of the label or the directory, and re-read on `hup`, until
        cancelled; a config that cannot be applied is logged and the running one stays."""
        from agents.tasks import first

        waits = [self._apply_changes(agent), self._watch_dir(), self._on(hup)]
        if self.api is not None:
            from agents.cluster.label_watch import follow_label

            waits.append(
                follow_label(self.api.client, self.api.node, self.label_key, self.label_seen)
            )
        await first(*waits)

    async def _on(self, hup: asyncio.Event) -> None:
        while True:
            await hup.wait()
            hup.clear()
            self.reread()

    async def _apply_changes(self, agent: Agent) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            forced, self._forced = self._forced, False
            await self._apply(agent, forced)

    async def _apply(self, agent: Agent, forced: bool) -> None:
        running = self.running
        assert running is not None, "start() comes first"
        try:
            files = await asyncio.to_thread(self._files)
            choice = choose(self.label, files, self.default, running.name)
            self._say(choice, files)
            if choice.name is None:
                return
            if choice.missing is not None and choice.name not in files | {BUILT_IN: ""}:
                return  # the running config's file went with what is wanted: it stays
            file, text = await asyncio.to_thread(self._text, choice.name, files)
        except ConfigError as exc:
            log.error("config_reload_refused", error=str(exc), kept=self.source(running.file))
            return
        if not forced and (file, text) == (running.file, running.text):
            self.running = Chosen(choice.name, file, text, running.config)
            return
        if not forced and (file, text) == self._refused:
            return  # said when it was refused
        await self._reload(agent, Chosen(choice.name, file, text, running.config))

    async def _reload(self, agent: Agent, wanted: Chosen) -> None:
        """Apply `wanted` (its text) through the agent's reload, as SIGHUP does."""
        running, source = self.running, self.source(wanted.file)
        assert running is not None
        log.info("config_reload", source=source, label=self.label_key, value=self.label)
        try:
            chosen = await asyncio.to_thread(self._parsed, wanted.name, wanted.file, wanted.text)
            await agent.reload(chosen.config, source)
        except AgentError as exc:
            if isinstance(exc, ConfigError):
                self._refused = (wanted.file, wanted.text)  # the same text: not said again
            log.error(
                "config_reload_refused",
                source=source,
                error=str(exc),
                kept=self.source(running.file),
            )
            return
        self.running, self._refused = chosen, None

    async def _watch_dir(self) -> None:
        """Wake on every change in the directory (a ConfigMap update swaps its `..data`
        link; a file may also be written in place); tried again while it cannot be."""
        unwatched = False
        while True:
            try:
                with DirectoryWatch(self.directory) as watch:
                    if unwatched:
                        log.info("config_dir_watched", dir=str(self.directory))
                    unwatched = False
                    self._wake.set()  # what changed while it was not watched
                    while not any(e.change & Change.DIR_GONE for e in await watch.next_batch()):
                        self._wake.set()
            except BackendError as exc:
                if not unwatched:
                    log.warning("config_dir_unwatched", error=str(exc), retry_in_s=DIR_RETRY_S)
                unwatched = True
            await asyncio.sleep(DIR_RETRY_S)
