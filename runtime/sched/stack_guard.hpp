// SPDX-License-Identifier: Apache-2.0
// Stack overflow reports. Every fiber stack has a PROT_NONE guard page below
// it (stack_pool.cpp); a fiber that runs off its stack faults there. The
// fault cannot be handled on the exhausted fiber stack, so each worker thread
// has an alternate signal stack and the SIGSEGV handler runs on it: it names
// the running fiber ("fiber N (cookie C) overflowed its S KiB stack") and
// aborts. Any other fault goes to whatever handler was installed before us.
#pragma once

#include <cstddef>

namespace coresched::detail {

/// Installs the process-wide SIGSEGV/SIGBUS handler unless it is in place.
void install_overflow_handler();

/// The calling thread's alternate signal stack, for as long as this object lives.
class AltSignalStack {
public:
  AltSignalStack();
  ~AltSignalStack();
  AltSignalStack(const AltSignalStack&) = delete;
  AltSignalStack& operator=(const AltSignalStack&) = delete;

private:
  void* mem_ = nullptr;
  std::size_t size_ = 0;
};

} // namespace coresched::detail
