#!/usr/bin/env bash
# Builds coresched with the isolation checker and runs the whole test suite.
#   scripts/test.sh                  # normal build (build-test/)
#   scripts/test.sh --sanitize address   # ASan+UBSan (build-asan/)
#   scripts/test.sh --sanitize thread    # TSan (build-tsan/)
set -euo pipefail
cd "$(dirname "$0")/.."
sanitize=""
if [ "${1:-}" = "--sanitize" ]; then sanitize="${2:?--sanitize needs address or thread}"; fi
bash scripts/deps.sh
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
cd "$dir" && ctest --output-on-failure --timeout 600
