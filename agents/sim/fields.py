"""Strict reading of parsed YAML: typed fields, unknown keys refused, errors with key paths."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NoReturn

from agents.errors import ConfigError

MappingValue = dict[str, object]


def key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class Fields:
    """Typed access to the mappings of one document; every failure is a ConfigError."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, expected: str) -> NoReturn:
        raise ConfigError(self.source, key, expected)

    def mapping(self, value: object, path: str, allowed: set[str]) -> MappingValue:
        if not isinstance(value, dict):
            self.fail(path or "<document>", "a mapping")
        for key in value:
            if not isinstance(key, str) or key not in allowed:
                self.fail(key_path(path, str(key)), f"one of {', '.join(sorted(allowed))}")
        return value

    def items(self, m: MappingValue, path: str, key: str) -> list[object]:
        value = m.get(key, [])
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(key_path(path, key), "a list")
        return value

    def integer(
        self, m: MappingValue, path: str, key: str, default: int, minimum: int | None = None
    ) -> int:
        value = self.optional_int(m, path, key, default)
        if value is None:
            self.fail(key_path(path, key), "an integer")
        if minimum is not None and value < minimum:
            self.fail(key_path(path, key), f"an integer >= {minimum}")
        return value

    def optional_int(self, m: MappingValue, path: str, key: str, default: int | None) -> int | None:
        value = m.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key_path(path, key), "an integer")
        if value < 0:
            self.fail(key_path(path, key), "an integer >= 0")
        return value

    def ints(self, m: MappingValue, path: str, key: str, minimum: int) -> list[int]:
        out: list[int] = []
        for i, value in enumerate(self.items(m, path, key)):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                self.fail(f"{key_path(path, key)}[{i}]", f"an integer >= {minimum}")
            out.append(value)
        return out

    def boolean(self, m: MappingValue, path: str, key: str, default: bool) -> bool:
        value = m.get(key, default)
        if not isinstance(value, bool):
            self.fail(key_path(path, key), "true or false")
        return value

    def string(
        self,
        m: MappingValue,
        path: str,
        key: str,
        default: str | None,
        *,
        pattern: str | None = None,
        expected: str = "a string",
        check: Callable[[str], bool] | None = None,
    ) -> str:
        if key not in m and default is None:
            self.fail(key_path(path, key), f"{expected} (required)")
        value = m.get(key, default)
        ok = isinstance(value, str) and value != ""
        if ok and pattern is not None:
            ok = re.fullmatch(pattern, str(value)) is not None
        if ok and check is not None:
            ok = check(str(value))
        if not ok:
            self.fail(key_path(path, key), expected)
        return str(value)

    def optional_string(
        self, m: MappingValue, path: str, key: str, pattern: str, expected: str
    ) -> str | None:
        if m.get(key) is None:
            return None
        return self.string(m, path, key, None, pattern=pattern, expected=expected)

    def strings(self, m: MappingValue, path: str, key: str) -> list[str]:
        out: list[str] = []
        for i, value in enumerate(self.items(m, path, key)):
            if not isinstance(value, str) or not value:
                self.fail(f"{key_path(path, key)}[{i}]", "a string")
            out.append(value)
        return out

    def choice(
        self, m: MappingValue, path: str, key: str, choices: tuple[str, ...], default: str
    ) -> str:
        value = m.get(key, default)
        if not isinstance(value, str) or value not in choices:
            self.fail(key_path(path, key), " or ".join(choices))
        return value
