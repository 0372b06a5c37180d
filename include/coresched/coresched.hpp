// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file coresched.hpp
/// Everything an application needs: #include <coresched/coresched.hpp>.

#include <coresched/blocking_call.hpp>
#include <coresched/cookie.hpp>
#include <coresched/fiber_local.hpp>
#include <coresched/io.hpp>
#include <coresched/join_handle.hpp>
#include <coresched/options.hpp>
#include <coresched/recv_stream.hpp>
#include <coresched/runtime.hpp>
#include <coresched/select.hpp>
#include <coresched/stats.hpp>
#include <coresched/sync.hpp>
#include <coresched/this_fiber.hpp>
#include <coresched/topology.hpp>
#include <coresched/version.hpp>
