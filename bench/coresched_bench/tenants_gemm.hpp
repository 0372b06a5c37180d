// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file tenants_gemm.hpp
/// The compute tenant's unit of work: one 64x64 single-precision matrix
/// multiply, vectorized for the best ISA the CPU has (AVX-512, AVX2 or SSE2).

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace coresched::bench::tenants {

inline constexpr std::size_t gemm_n = 64;

/// A gemm_n x gemm_n matrix in pages of its own (16 KiB: four whole pages),
/// zeroed. Where a, b and c sit relative to each other in the low 12 address
/// bits decides whether the stores to c are taken for dependencies of the
/// loads of b (4K aliasing), so it must not depend on the heap. In
/// std::vectors they would fall where each build's allocations put them, and
/// GEMM/s could read 63-65 k in one build and 69-83 k in another of the same
/// code (docs/performance.md, "Tenants' GEMM figure").
class PageMatrix {
public:
  static constexpr std::size_t bytes = gemm_n * gemm_n * sizeof(float);
  PageMatrix() : p_(static_cast<float*>(std::aligned_alloc(4096, bytes))) {
    if (!p_) throw std::bad_alloc();
    for (std::size_t i = 0; i < gemm_n * gemm_n; ++i) p_[i] = 0;
  }
  float* data() noexcept { return p_.get(); }
  const float* data() const noexcept { return p_.get(); }
  float& operator[](std::size_t i) noexcept { return p_[i]; }
  float operator[](std::size_t i) const noexcept { return p_[i]; }
  const float* begin() const noexcept { return p_.get(); }
  const float* end() const noexcept { return p_.get() + gemm_n * gemm_n; }

private:
  struct Free {
    void operator()(float* p) const noexcept { std::free(p); }
  };
  std::unique_ptr<float[], Free> p_;
};
static_assert(PageMatrix::bytes % 4096 == 0, "each matrix fills whole pages");

/// Rows [first, last) of c = a * b for row-major gemm_n x gemm_n matrices
/// (`c` must not alias): a GEMM in pieces, so that the compute tenant reaches
/// a preemption point between them.
void gemm64_rows(const float* a, const float* b, float* c, std::size_t first, std::size_t last) noexcept;

} // namespace coresched::bench::tenants
