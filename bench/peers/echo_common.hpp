// SPDX-License-Identifier: Apache-2.0
// Socket helpers shared by the echo servers and the echo load generator.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace peers {

/// 1,000 connections need more descriptors than a 1,024 soft limit leaves: raise it to the hard limit.
inline void raise_nofile_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

[[noreturn]] inline void throw_errno(const char* what) {
  throw std::runtime_error(std::string(what) + ": " + std::strerror(errno));
}

/// A listening TCP socket on 127.0.0.1:`port` (0: any free port). With
/// `reuseport`, several listeners may share the port and the kernel spreads
/// new connections over them (by a hash of the 4-tuple).
inline int make_listener(int port, bool reuseport, bool nonblocking) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) throw_errno("socket");
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) throw_errno("SO_REUSEPORT");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) throw_errno("bind");
  if (listen(fd, 4096) != 0) throw_errno("listen"); // 1,000 clients connect in a burst
  return fd;
}

/// The port a bound socket listens on.
inline int local_port(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) throw_errno("getsockname");
  return ntohs(a.sin_port);
}

/// Echo traffic is one small message per round trip: never wait for Nagle.
inline void set_nodelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/// Tells the driver where to connect ("PORT <n>" on a line of its own).
inline void announce_port(int port) {
  std::printf("PORT %d\n", port);
  std::fflush(stdout);
}

} // namespace peers
