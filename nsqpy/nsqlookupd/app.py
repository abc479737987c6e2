"""The ``nsqlookupd`` command. Being built."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    sys.stderr.write("nsqlookupd: not built yet\n")
    sys.exit(1)
