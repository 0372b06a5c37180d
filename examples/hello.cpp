// SPDX-License-Identifier: Apache-2.0
// hello: start a runtime, print the topology, spawn and join fibers.
#include <coresched/coresched.hpp>

#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

// The example proper: a runtime, eight fibers, their results.
static int run() {
  coresched::Runtime rt; // CORESCHED_TOPOLOGY chooses a synthetic topology if set
  std::printf("%s\n", rt.topology().describe().c_str());

  std::vector<coresched::JoinHandle<int>> fibers;
  for (int i = 0; i < 8; ++i) {
    fibers.push_back(rt.spawn([i] {
      coresched::this_fiber::yield();
      const auto where = coresched::this_fiber::location();
      std::printf("fiber %d (id %llu) on worker %u, core %u, CPU %u\n", i,
                  static_cast<unsigned long long>(coresched::this_fiber::id()), where.worker, where.core, where.cpu);
      return i * i;
    }));
  }
  int sum = 0;
  for (auto& f : fibers) sum += f.join();
  std::printf("sum of squares 0..7 = %d\n", sum);
  return sum == 140 ? 0 : 1;
}

int main(int argc, char** argv) {
  // No options; a hand parse keeps this example free of any dependency but coresched.
  if (argc > 1) {
    const bool help = std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0;
    std::fprintf(help ? stdout : stderr,
                 "%sUsage: %s\nStarts a runtime (CORESCHED_TOPOLOGY picks a synthetic topology), prints it, runs "
                 "8 fibers and checks their results.\n",
                 help ? "" : "error: hello takes no arguments\n", argv[0]);
    return help ? 0 : 2;
  }
  // A bad CORESCHED_TOPOLOGY (or other setting) is a message, not a terminate.
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hello: %s\n", e.what());
    return 1;
  }
}
