"""`node-agent` with the listing API (tests/third/api.py) among those --api chooses from,
on tests/timing.py's short times: `python -m tests.third.agent run --api listing ...`."""

from __future__ import annotations

import sys

from agents.apis import APIS
from agents.cli import main
from tests.third.api import ListingApi
from tests.timing import SHORT

if __name__ == "__main__":
    sys.exit(main(timing=SHORT, apis=(*APIS, ListingApi())))
