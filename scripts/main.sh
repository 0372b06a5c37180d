#!/usr/bin/env bash
# The main job: builds coresched (Release) and runs the bundled fairness
# benchmark, `coresched-bench matrix` (seed 000), on this machine's topology
# with short settings (about a minute). Extra arguments go to the benchmark.
# On a machine without SMT it says so and uses synthetic siblings.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --plots
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF >/dev/null
cmake --build build -j"$(nproc)" --target coresched-bench
./build/bench/coresched_bench/coresched-bench matrix --time 3 --runs 3 --json build/matrix.json "$@"
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  /usr/bin/python3 bench/plot/plot_matrix.py build/matrix.json -o build/matrix.png && echo "chart: build/matrix.png"
fi
echo "figures: build/matrix.json"
