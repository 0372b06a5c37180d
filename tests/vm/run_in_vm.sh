#!/usr/bin/env bash
# ctest's way into scripts/smt-vm.sh: exits 77 (the vm tests' SKIP_RETURN_CODE) with the reason when no guest can
# run here (no qemu, no cached kernel and nothing to build one with), or when CORESCHED_VM_TESTS=0; else runs
# smt-vm.sh with these arguments (its exit code is the guest command's; 124 on its timeout).
set -uo pipefail
vm=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../scripts" && pwd)/smt-vm.sh
if [[ ${CORESCHED_VM_TESTS:-1} == 0 ]]; then echo "SKIP: CORESCHED_VM_TESTS=0"; exit 77; fi
if ! why=$("$vm" --check 2>&1); then
  echo "SKIP: no SMT guest can run here: $why"
  exit 77
fi
exec "$vm" "$@"
