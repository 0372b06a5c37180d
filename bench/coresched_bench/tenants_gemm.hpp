// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file tenants_gemm.hpp
/// The compute tenant's unit of work: one 64x64 single-precision matrix
/// multiply, vectorized for the best ISA the CPU has (AVX-512, AVX2 or SSE2).

#include <cstddef>

namespace coresched::bench::tenants {

inline constexpr std::size_t gemm_n = 64;

/// c = a * b for row-major gemm_n x gemm_n matrices; `c` must not alias.
void gemm64(const float* a, const float* b, float* c) noexcept;

} // namespace coresched::bench::tenants
