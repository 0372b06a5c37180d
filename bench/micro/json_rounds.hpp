// SPDX-License-Identifier: Apache-2.0
// The --json file of the micro benchmarks that measure in rounds: one object,
// the run's parameters first, then "rounds": an array of one object per
// round. Each round is written as it ends, so a run stopped by an error still
// leaves valid JSON with the rounds it finished.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <string>

class JsonRounds {
public:
  /// No file when `path` is empty; ok() is false, with a message on stderr,
  /// when it cannot be written.
  JsonRounds(const std::string& path, const char* program) {
    if (path.empty()) return;
    f_ = std::fopen(path.c_str(), "w");
    if (!f_) {
      std::fprintf(stderr, "%s: cannot write %s\n", program, path.c_str());
      failed_ = true;
    }
  }
  JsonRounds(const JsonRounds&) = delete;
  JsonRounds& operator=(const JsonRounds&) = delete;
  ~JsonRounds() {
    if (!f_) return;
    std::fputs(begun_ ? "]}\n" : "{}\n", f_);
    std::fclose(f_);
  }
  bool ok() const noexcept { return !failed_; }

  /// The parameters: JSON fields without braces (`"slice_us": 1000, ...`).
  __attribute__((format(printf, 2, 3))) void parameters(const char* fmt, ...) {
    if (!f_) return;
    std::fputc('{', f_);
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(f_, fmt, ap);
    va_end(ap);
    std::fputs(", \"rounds\": [", f_);
    begun_ = true;
  }
  /// One round: JSON fields without braces.
  __attribute__((format(printf, 2, 3))) void round(const char* fmt, ...) {
    if (!f_ || !begun_) return;
    std::fputs(rounds_++ ? ", {" : "{", f_);
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(f_, fmt, ap);
    va_end(ap);
    std::fputc('}', f_);
    std::fflush(f_);
  }

private:
  std::FILE* f_ = nullptr;
  bool failed_ = false;
  bool begun_ = false;
  unsigned rounds_ = 0;
};
