"""agents/core stays pure logic: no I/O, clocks, processes or wire formats."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import agents.core

CORE = Path(agents.core.__file__).parent
FORBIDDEN = frozenset(
    {
        "grpc",
        "pynvml",
        "pyroute2",
        "os",
        "time",
        "asyncio",
        "subprocess",
        "socket",
        "pathlib",
        "structlog",
    }
)


def imported_roots(source: str) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("module", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module_imports_nothing_impure(module: Path) -> None:
    assert imported_roots(module.read_text()) & FORBIDDEN == set()


def test_the_check_sees_every_kind_of_import() -> None:
    source = "import os.path\nfrom time import monotonic\nimport grpc.aio as g\nfrom . import x\n"
    assert imported_roots(source) == {"os", "time", "grpc"}
