"""Kubernetes quantities ("80Gi", "81920Mi", "1e3") read as exact numbers: what the API
server stores, what a config's sizes say."""

from __future__ import annotations

import re
from fractions import Fraction

QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)
BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def quantity(text: str) -> Fraction | str:
    """A Kubernetes quantity's exact value; the text itself when it is none."""
    m = QUANTITY.match(text.strip())
    if m is None:
        return text
    number, exponent, suffix = Fraction(m.group(1)), m.group(2), m.group(3)
    if exponent is not None:
        return number * Fraction(10) ** int(exponent)
    if suffix in BINARY:
        return number * BINARY[suffix]
    return number * Fraction(10) ** DECIMAL.get(suffix or "", 0)
