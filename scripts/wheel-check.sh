#!/usr/bin/env bash
# scripts/wheel-check.sh WHEEL: the wheel is self-contained. auditwheel must
# find it consistent with the manylinux tag it carries (every shared library
# it needs beyond the policy's glibc/libstdc++ set is inside it), and it must
# install and run where Debian's simdjson and RE2 are not: in a private mount
# namespace (unshare) whose /usr/lib hides libsimdjson* and libre2* (each
# bind-mounted over by an empty file) and whose /usr/include is empty (no
# -dev headers), a fresh venv installs the wheel alone and runs
# mx2nv.inspect and the mx2nv command on a generated checkpoint, mapping the
# wheel's own simdjson and RE2. Where mount namespaces are not allowed (an
# unprivileged container), the same run without the hiding still checks
# which copies the process maps.
# Needs auditwheel on PATH and util-linux's unshare.
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=$(realpath "$1")
tag=$(basename "$wheel" .whl); tag=${tag##*-}

show=$(auditwheel show "$wheel" | tr -s '[:space:]' ' ')  # it wraps its lines
if ! grep -qF "consistent with the following platform tag: \"$tag\"" <<<"$show"; then
  echo "wheel-check: auditwheel show does not find $(basename "$wheel") consistent with its tag $tag:" >&2
  echo "$show" >&2
  exit 1
fi
case $tag in manylinux*) ;; *) echo "wheel-check: $tag is not a manylinux tag" >&2; exit 1 ;; esac

work=build/wheel-check
rm -rf "$work" && mkdir -p "$work"
work=$(realpath "$work")

# The fresh venv, the wheel alone in it, run from outside the source tree:
# the simdjson and RE2 the process maps must be the wheel's own copies
# (/proc/self/maps), and the import, mx2nv.inspect and the mx2nv command work.
run_from_wheel() {  # WORK WHEEL HIDDEN
  local work=$1 wheel=$2 hidden=$3
  unset LD_LIBRARY_PATH
  rm -rf "$work/venv"
  python3 -m venv "$work/venv"
  "$work/venv/bin/python" -m pip install -q --no-index --no-deps "$wheel"
  rm -rf "$work/ck"
  "$work/venv/bin/mx2nv" generate "$work/ck" --layers 1 --experts 2 --hidden 64 --intermediate 64 >/dev/null
  (cd "$work" && "$work/venv/bin/python" - "$work/ck" "$hidden" <<'PY'
import sys

import mx2nv

r = mx2nv.inspect(sys.argv[1])
assert r.result == "ok" and len(r.modules) > 0, r
maps = [line.split()[-1] for line in open("/proc/self/maps") if "/" in line]
for lib in ("libsimdjson", "libre2"):
    paths = sorted({p for p in maps if p.rsplit("/", 1)[-1].startswith(lib)})
    assert paths and all("/mx2nv.libs/" in p for p in paths), (lib, paths)
print(f"wheel-check: mx2nv.inspect ran from the wheel alone ({len(r.modules)} modules; simdjson and RE2 "
      f"from mx2nv.libs/; {sys.argv[2]})")
PY
  )
  "$work/venv/bin/mx2nv" inspect "$work/ck" >/dev/null
}

# Where mount namespaces are allowed, the same with the system's copies
# hidden (bind-mounted over by an empty file) and /usr/include empty: what a
# machine without those packages has.
unshare_flags=(--mount --propagation private)
[[ $(id -u) -eq 0 ]] || unshare_flags+=(--map-root-user)
if ! unshare "${unshare_flags[@]}" true 2>/dev/null; then
  run_from_wheel "$work" "$wheel" "system copies present: no mount namespace here (unshare refused)"
  exit 0
fi
export -f run_from_wheel
unshare "${unshare_flags[@]}" bash -euo pipefail -c '
  work=$1 wheel=$2
  : > "$work/empty"
  hidden=0
  for f in /usr/lib/*/libsimdjson* /usr/lib/*/libre2* /lib/*/libsimdjson* /lib/*/libre2*; do
    [[ -f $f ]] || continue
    mount --bind "$work/empty" "$f"
    hidden=$((hidden + 1))
  done
  mount -t tmpfs none /usr/include
  # The hiding works: the system copies cannot be loaded any more.
  for lib in libsimdjson.so.14 libre2.so.9; do
    if python3 -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" "$lib" 2>/dev/null; then
      echo "wheel-check: $lib still loads inside the namespace" >&2; exit 1
    fi
  done
  run_from_wheel "$work" "$wheel" "the system copies hidden ($hidden files) and /usr/include empty"
' wheel-check "$work" "$wheel"
