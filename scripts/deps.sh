#!/usr/bin/env bash
# Installs the Debian packages coresched needs; does nothing if all are present.
#   scripts/deps.sh          build, test and benchmark dependencies
#   scripts/deps.sh --plots  also matplotlib, for bench/plot/
#   scripts/deps.sh --vm     also qemu and what building the guest kernel of scripts/smt-vm.sh needs, and sysbench
set -euo pipefail
packages=(build-essential cmake pkg-config git python3 hwloc libhwloc-dev liburing-dev libboost-context-dev
          libboost-fiber-dev libspdlog-dev libfmt-dev catch2 libcli11-dev zlib1g-dev golang-go valgrind libdw-dev
          libseccomp-dev)
for opt in "$@"; do
  case "$opt" in
    --plots) packages+=(python3-matplotlib) ;;
    --vm) packages+=(qemu-system-x86 linux-source-6.1 flex bison libelf-dev bc cpio sysbench) ;;
    *) echo "usage: scripts/deps.sh [--plots] [--vm]" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[deps] installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
