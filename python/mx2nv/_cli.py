"""The ``mx2nv`` console command of the wheel: the C++ command line built
with the package (mx2nv/_bin/mx2nv), executed in place of this process so
signals, the terminal and exit codes are exactly the CLI's."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def executable() -> Path:
    return Path(__file__).resolve().parent / "_bin" / "mx2nv"


def main() -> None:
    exe = executable()
    if not os.access(exe, os.X_OK):
        from ._errors import printable

        sys.stderr.write(f"mx2nv: the command line is missing from the installed package ({printable(str(exe))})\n")
        raise SystemExit(4)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, ["mx2nv", *sys.argv[1:]])


if __name__ == "__main__":
    main()
