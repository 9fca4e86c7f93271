#!/usr/bin/env bash
# The Python environment of the conformance suite: .venv with the pinned
# ecosystem libraries. Re-installs only when the requirements change.
set -euo pipefail
cd "$(dirname "$0")/.."
REQ=tests/conformance/requirements.txt
if [[ ! -x .venv/bin/python ]]; then python3 -m venv .venv; fi
stamp=.venv/.requirements.sha256
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -r "$REQ"
  echo "$want" > "$stamp"
fi
