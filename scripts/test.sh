#!/usr/bin/env bash
# Builds coresched with the isolation checker and runs the whole test suite;
# the normal run then also checks the installed package (find_package and
# pkg-config, the examples built against it) and the hot paths' instruction
# budgets (callgrind, bench/budget/).
#   scripts/test.sh                  # normal build (build-test/), with the vm tests
#   scripts/test.sh --sanitize address   # ASan+UBSan (build-asan/)
#   scripts/test.sh --sanitize thread    # TSan (build-tsan/)
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=""
if [ "${1:-}" = "--sanitize" ]; then sanitize="${2:?--sanitize needs address or thread}"; fi
# The plain suite also runs the `vm` tests (tests/vm: real SMT siblings and the kernel's core scheduling in a
# QEMU guest), so it installs qemu and the guest kernel's build dependencies; CORESCHED_VM_TESTS=0 skips them.
if [ -z "$sanitize" ] && [ "${CORESCHED_VM_TESTS:-1}" != 0 ]; then bash scripts/deps.sh --vm; else bash scripts/deps.sh; fi
dir=build-test
[ -n "$sanitize" ] && dir="build-${sanitize/address/asan}" && dir="${dir/thread/tsan}"
jobs=$(nproc)
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCORESCHED_ISOLATION_CHECK=ON -DCORESCHED_WERROR=$([ -n "$sanitize" ] && echo OFF || echo ON) \
  -DCORESCHED_SANITIZE="$sanitize" -DCORESCHED_BUILD_BENCH=$([ -n "$sanitize" ] && echo OFF || echo ON) >/dev/null
cmake --build "$dir" -j"$jobs"
# Sanitized builds run 5-50x slower: scale the stress tests down (still >= 200k events).
[ -n "$sanitize" ] && export CORESCHED_STRESS_SCALE=0.2
[ "$sanitize" = "thread" ] && export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
[ "$sanitize" = "address" ] && export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=0"
(cd "$dir" && ctest --output-on-failure --timeout 600)
[ -n "$sanitize" ] && exit 0

# The installed package works: install into a temporary prefix and build and
# run the examples as a project of their own against it (find_package).
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$dir" --prefix "$prefix" >/dev/null
cmake -S examples -B "$dir/examples-installed" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$dir/examples-installed" -j"$jobs"
(cd "$dir/examples-installed" && ctest --output-on-failure --timeout 120)
# ... and through pkg-config.
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --exists --print-errors coresched
c++ examples/hello.cpp -o "$dir/hello-pkgconfig" $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs coresched)
CORESCHED_TOPOLOGY="core:2 pu:2" "$dir/hello-pkgconfig" >/dev/null

# Instruction budgets of the hot paths (callgrind; Release build, as shipped).
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
cmake --build build -j"$jobs" --target coresched-instr-budget
python3 bench/budget/check_budgets.py build/bench/budget/coresched-instr-budget
