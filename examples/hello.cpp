// SPDX-License-Identifier: Apache-2.0
// Start a runtime, print the topology, spawn and join fibers.
#include <coresched/coresched.hpp>

#include <cstdio>
#include <vector>

int main() {
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
