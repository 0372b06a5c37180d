// SPDX-License-Identifier: Apache-2.0
// Compiled at -O3 (see CMakeLists.txt): at -O2, g++ 12 does not vectorize
// this loop. target_clones builds it for AVX-512, AVX2 and plain x86-64 and
// picks one at load time, so the binary is as fast as -march=native here yet
// still runs on any x86-64 machine. Not under sanitizers: the clone resolver
// runs during relocation, before their runtime is up, and an instrumented one
// crashes the program at start (TSan); a sanitizer build checks, not times.
#include "tenants_gemm.hpp"

namespace coresched::bench::tenants {

#if defined(__x86_64__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void gemm64_rows(const float* __restrict a, const float* __restrict b, float* __restrict c, std::size_t first,
                 std::size_t last) noexcept {
  constexpr std::size_t n = gemm_n;
  for (std::size_t i = first * n; i < last * n; ++i) c[i] = 0;
  // i-k-j order: the innermost loop walks a row of b and a row of c, both
  // contiguous, so it becomes vector multiply-adds.
  for (std::size_t i = first; i < last; ++i)
    for (std::size_t k = 0; k < n; ++k) {
      const float aik = a[i * n + k];
      for (std::size_t j = 0; j < n; ++j) c[i * n + j] += aik * b[k * n + j];
    }
}

} // namespace coresched::bench::tenants
