"""--families: every family of agents/families.py unless it names some, so that a family
added there runs by default without the command line changing."""

from __future__ import annotations

import pytest

from agents.command_line import parse_args
from agents.errors import ConfigError
from agents.families import KINDS, parse_families


def test_no_families_flag_runs_every_kind_of_the_list_whatever_it_holds() -> None:
    default = parse_args(["run"]).families
    assert default is None  # not a spelled-out list that a new kind would be missing from
    assert parse_families(default) == KINDS


def test_a_families_flag_runs_the_named_kinds_in_the_lists_order() -> None:
    assert [k.name for k in parse_families("roce,gpu")] == ["gpu", "roce"]
    assert [k.name for k in parse_families(parse_args(["run", "--families", "roce"]).families)] == [
        "roce"
    ]


@pytest.mark.parametrize("text", ["", "tpu", "gpu,tpu"], ids=["empty", "unknown", "one-unknown"])
def test_a_families_flag_naming_no_known_kind_is_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_families(text)
