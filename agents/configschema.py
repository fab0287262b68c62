"""Typed readers that walk an untyped YAML tree, and the value checks the config uses.

Every failure is a `SchemaError` carrying the key path and what was expected there.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Literal, TypeVar

from agents.core.fabric_place import is_label_value

if TYPE_CHECKING:
    import yaml

T = TypeVar("T")
S = TypeVar("S", bound=str)
Check = Callable[[object], T]
ReplicatedDevices = Literal["all"] | int | tuple[str, ...]
"""Which GPUs a time-slicing entry covers: all, the first n, or these indexes/UUIDs."""


class SchemaError(Exception):
    """A value that does not fit the schema; `path` is relative until a Section adds its own."""

    def __init__(self, expected: str, path: str = "") -> None:
        super().__init__(expected)
        self.expected = expected
        self.path = path

    def under(self, prefix: str) -> SchemaError:
        """The same error, placed under `prefix` (a key path or `[i]`)."""
        sep = "." if self.path and not self.path.startswith("[") else ""
        return SchemaError(self.expected, f"{prefix}{sep}{self.path}" if prefix else self.path)


def shown(value: object) -> str:
    """How a YAML value is quoted in error messages."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, int | float):
        return repr(value)
    kinds: dict[type, str] = {dict: "a mapping", list: "a list"}
    return kinds.get(type(value), f"a {type(value).__name__} ({value!s:.60})")


def bad(expected: str, value: object) -> SchemaError:
    return SchemaError(f"{expected}, got {shown(value)}")


class Section:
    """A YAML mapping at `path` whose keys must all be in `keys`; null reads as empty."""

    def __init__(self, raw: object, path: str, keys: tuple[str, ...], ignored: list[str]) -> None:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise bad("a mapping", raw).under(path or "(top level)")
        for key in raw:
            if key not in keys:
                where = self._join(
                    path, key if isinstance(key, str) and key.isprintable() else shown(key)
                )
                raise SchemaError(f"unknown key; expected one of: {', '.join(keys)}", where)
        self._raw: dict[object, object] = raw
        self.path = path
        self.ignored = ignored

    @staticmethod
    def _join(path: str, key: str) -> str:
        return f"{path}.{key}" if path else key

    def at(self, key: str) -> str:
        """The full path of `key` in this section."""
        return self._join(self.path, key)

    def has(self, key: str) -> bool:
        return self._raw.get(key) is not None

    def raw(self, key: str) -> object:
        return self._raw.get(key)

    def value(self, key: str, check: Check[T], default: T) -> T:
        """`key` read through `check`, or `default` when absent or null."""
        return default if not self.has(key) else self.required(key, check, "")

    def required(self, key: str, check: Check[T], expected: str) -> T:
        """`key` read through `check`; absent or null is an error saying `expected`."""
        if not self.has(key):
            raise SchemaError(f"required: {expected}", self.at(key))
        try:
            return check(self._raw[key])
        except SchemaError as err:
            raise err.under(self.at(key)) from None

    def section(self, key: str, keys: tuple[str, ...]) -> Section:
        return Section(self._raw.get(key), self.at(key), keys, self.ignored)

    def each(self, key: str) -> Iterator[tuple[str, object]]:
        """(path, item) for each item of the list at `key`; absent or null is empty."""
        raw = self._raw.get(key)
        if raw is None:
            return
        if not isinstance(raw, list):
            raise bad("a list", raw).under(self.at(key))
        for i, item in enumerate(raw):
            yield f"{self.at(key)}[{i}]", item

    def ignore(self, key: str, check: Check[object]) -> None:
        """Type-check a key that is accepted for compatibility but has no effect here."""
        if self.has(key):
            self.value(key, check, None)
            self.ignored.append(self.at(key))


def boolean(value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise bad("true or false", value)


def integer(minimum: int) -> Check[int]:
    def check(value: object) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
            return value
        raise bad(f"an integer >= {minimum}", value)

    return check


def text(value: object) -> str:
    if isinstance(value, str) and value:
        return value
    raise bad("a non-empty string", value)


def matching(pattern: str, expected: str, normalise: Callable[[str], str] = str) -> Check[str]:
    compiled = re.compile(pattern)

    def check(value: object) -> str:
        if isinstance(value, str) and compiled.fullmatch(value):
            return normalise(value)
        raise bad(expected, value)

    return check


def one_of(choices: tuple[S, ...]) -> Check[S]:
    def check(value: object) -> S:
        for choice in choices:
            if value == choice and isinstance(value, str):
                return choice
        raise bad(f"one of {', '.join(choices)}", value)

    return check


def list_of(
    item: Check[T], *, nonempty: bool = False, single: bool = False
) -> Check[tuple[T, ...]]:
    """A list whose items pass `item`; `single` also accepts one bare string."""

    def check(value: object) -> tuple[T, ...]:
        if single and isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise bad("a list", value)
        if nonempty and not value:
            raise SchemaError("a non-empty list, got []")
        out: list[T] = []
        for i, raw in enumerate(value):
            try:
                out.append(item(raw))
            except SchemaError as err:
                raise err.under(f"[{i}]") from None
        return tuple(out)

    return check


def mapping_of(key: Check[str], value: Check[T]) -> Check[dict[str, T]]:
    """A mapping whose keys pass `key` and values pass `value`; errors name the key."""

    def check(raw: object) -> dict[str, T]:
        if not isinstance(raw, dict):
            raise bad("a mapping", raw)
        out: dict[str, T] = {}
        for k, v in raw.items():
            name = key(k)
            try:
                out[name] = value(v)
            except SchemaError as err:
                raise err.under(name) from None
        return out

    return check


def label_value(value: object) -> str:
    """A non-empty Kubernetes label value, as a node label carries it."""
    if isinstance(value, str) and is_label_value(value):
        return value
    raise bad("a label value: at most 63 of A-Z a-z 0-9 . _ -, alphanumeric at both ends", value)


@functools.cache
def _strict_loader() -> type[yaml.SafeLoader]:
    """The safe loader, refusing duplicated mapping keys instead of keeping the last.
    Made at the first YAML read: an agent given no file never loads the YAML library."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(
            self, node: yaml.MappingNode, deep: bool = False
        ) -> dict[object, object]:
            seen: set[object] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, str | int | float | bool) or key is None:
                    if key in seen:
                        line = key_node.start_mark.line + 1
                        raise SchemaError(
                            f"a key given once, got {shown(key)} again", f"line {line}"
                        )
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def load_yaml(text_: str) -> object:
    """The single YAML document in `text_`; syntax errors become SchemaError at `line N`."""
    import yaml

    try:
        return yaml.load(text_, Loader=_strict_loader())  # a SafeLoader subclass
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(document)"
        raise SchemaError(f"valid YAML: {err.problem or err.context}", where) from None
    except yaml.YAMLError as err:
        raise SchemaError(f"valid YAML: {str(err).splitlines()[0]}", "(document)") from None
    except (ValueError, OverflowError, RecursionError) as err:
        raise SchemaError(f"a loadable YAML value: {err}", "(document)") from None


def string(value: object) -> str:
    if isinstance(value, str):
        return value
    raise bad("a string", value)


_go_duration = matching(
    r"[-+]?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h))+)",
    "a duration such as 60s, or infinite",
)


def duration(value: object) -> object:
    """A duration as the v1 format reads one: a number of nanoseconds, Go's duration
    syntax, or `infinite`."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return "infinite" if value == "infinite" else _go_duration(value)


def host_root(value: object) -> str:
    """A host directory given as a root (driver or device nodes); empty means `/`."""
    if isinstance(value, str) and (value == "" or value.startswith("/")):
        return value
    raise bad("an absolute path such as /run/nvidia/driver", value)


_DOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_EXTENDED_NAME = re.compile(
    rf"(?=[^/]{{1,244}}/){_DOMAIN}/(?=.{{1,63}}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
EXTENDED_NAME = "an extended resource name domain/name (e.g. rdma/roce)"
_ANNOTATION_PREFIX = re.compile(rf"(?=.{{1,253}}/$){_DOMAIN}/")


def annotation_prefix(value: object) -> str:
    """The prefix of an annotation key: a DNS subdomain and '/' (e.g. cdi.k8s.io/)."""
    if isinstance(value, str) and _ANNOTATION_PREFIX.fullmatch(value):
        return value
    raise bad("an annotation key prefix such as cdi.k8s.io/", value)


def extended_name(value: object) -> str:
    """A Kubernetes extended resource name: a DNS domain outside kubernetes.io, '/', a name."""
    if isinstance(value, str) and _EXTENDED_NAME.fullmatch(value):
        domain = value.split("/", 1)[0]
        native = domain == "kubernetes.io" or domain.endswith(".kubernetes.io")
        if not native and not value.startswith("requests."):
            return value
    raise bad(EXTENDED_NAME, value)


def shared_name(value: object) -> str:
    """A resource name in sharing: a bare name means nvidia.com/<name>, as in the v1 format."""
    if isinstance(value, str) and "/" not in value:
        try:
            return extended_name(f"nvidia.com/{value}")
        except SchemaError:
            raise bad(EXTENDED_NAME, value) from None
    return extended_name(value)


def gpu_resource(value: object) -> str:
    name = shared_name(value)
    if name == "nvidia.com/gpu" or name.startswith("nvidia.com/mig-"):
        return name
    raise bad("a GPU resource: nvidia.com/gpu or nvidia.com/mig-<profile>", value)


_device_ref = matching(
    r"[0-9]+(:[0-9]+)?|GPU-[0-9A-Za-z-]+|MIG-[0-9A-Za-z-]+(/[0-9]+/[0-9]+)?", "a GPU index or UUID"
)


def _device_item(value: object) -> str:
    return (
        str(value)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0
        else _device_ref(value)
    )


def devices(value: object) -> ReplicatedDevices:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if value == "all":
        return "all"
    if not isinstance(value, list):
        raise bad('"all", a GPU count >= 1 or a list of GPU indexes or UUIDs', value)
    refs = list_of(_device_item, nonempty=True)(value)
    for i, ref in enumerate(refs):
        if ref in refs[:i]:
            raise SchemaError(f"each GPU listed once, got {shown(ref)} again", f"[{i}]")
    return refs


vendor = matching(r"[0-9a-fA-F]{4}", 'a quoted 4-hex-digit vendor ID such as "15b3"', str.lower)
pci_address = matching(
    r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]",
    "a PCI address such as 0000:1c:00.0",
    str.lower,
)


def link_layer(value: object) -> str:
    if value == "InfiniBand":
        raise SchemaError("Ethernet (InfiniBand devices are not the RoCE family), got 'InfiniBand'")
    return one_of(("Ethernet",))(value)
