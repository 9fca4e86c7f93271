#!/usr/bin/env bash
# scripts/wheel-check.sh WHEEL: the wheel is self-contained. auditwheel must
# find it consistent with the manylinux tag it carries (every shared library
# it needs beyond the policy's glibc/libstdc++ set is inside it), and it must
# install and run where Debian's simdjson and RE2 are not: in a private mount
# namespace (unshare) whose /usr/lib hides libsimdjson* and libre2* (each
# bind-mounted over by an empty file) and whose /usr/include is empty (no
# -dev headers), a fresh venv installs the wheel alone and runs
# mx2nv.inspect and the mx2nv command on a generated checkpoint.
# Needs auditwheel on PATH, util-linux's unshare, and build/mx2nv (to
# generate the checkpoint outside the namespace).
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=$(realpath "$1")
tag=$(basename "$wheel" .whl); tag=${tag##*-}

show=$(auditwheel show "$wheel")
if ! grep -q "consistent with the following platform tag: \"$tag\"" <<<"$show"; then
  echo "wheel-check: auditwheel show does not find $(basename "$wheel") consistent with its tag $tag:" >&2
  echo "$show" >&2
  exit 1
fi
case $tag in manylinux*) ;; *) echo "wheel-check: $tag is not a manylinux tag" >&2; exit 1 ;; esac

work=build/wheel-check
rm -rf "$work" && mkdir -p "$work"
work=$(realpath "$work")
build/mx2nv generate "$work/ck" --layers 1 --experts 2 --hidden 64 --intermediate 64 >/dev/null

unshare_flags=(--mount --propagation private)
[[ $(id -u) -eq 0 ]] || unshare_flags+=(--map-root-user)
unshare "${unshare_flags[@]}" bash -euo pipefail -c '
  work=$1 wheel=$2
  : > "$work/empty"
  hidden=0
  for f in /usr/lib/*/libsimdjson* /usr/lib/*/libre2* /lib/*/libsimdjson* /lib/*/libre2*; do
    [[ -f $f ]] || continue
    mount --bind "$work/empty" "$f" && hidden=$((hidden + 1))
  done
  mount -t tmpfs none /usr/include
  # The hiding works: the system copy cannot be loaded any more.
  if python3 -c "import ctypes; ctypes.CDLL(\"libsimdjson.so.14\")" 2>/dev/null ||
     python3 -c "import ctypes; ctypes.CDLL(\"libre2.so.9\")" 2>/dev/null; then
    echo "wheel-check: libsimdjson or libre2 still loads inside the namespace" >&2; exit 1
  fi
  unset LD_LIBRARY_PATH
  python3 -m venv "$work/venv"
  "$work/venv/bin/python" -m pip install -q --no-index --no-deps "$wheel"
  cd "$work"  # not the source tree: mx2nv is the installed wheel
  "$work/venv/bin/python" -c "
import sys, mx2nv
r = mx2nv.inspect(sys.argv[1])
assert r.result == \"ok\" and len(r.modules) > 0, r
print(f\"wheel-check: mx2nv.inspect ran from the wheel alone ({len(r.modules)} modules; system libraries hidden: $hidden)\")
" "$work/ck"
  "$work/venv/bin/mx2nv" inspect "$work/ck" >/dev/null
' wheel-check "$work" "$wheel"
