# Sourced by scripts/setup.sh and scripts/test-deps.sh: installs the Debian
# packages among "$@" (after any apt-get flags) that dpkg lacks, with sudo
# when not root; nothing (not even apt-get update) when none is missing.
install_missing() {
  local flags=() missing=() p
  while [[ $# -gt 0 && $1 == -* ]]; do flags+=("$1"); shift; done
  for p in "$@"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  echo "installing ${missing[*]}"
  local SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${flags[@]}" "${missing[@]}" >/dev/null
}
