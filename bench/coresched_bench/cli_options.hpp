// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file cli_options.hpp
/// Command-line options several subcommands share, so each spells its
/// --topology, --policy, --placement, --slice-us and --json the same way.

#include <coresched/options.hpp>

#include <CLI/CLI.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace coresched::bench {

/// A number of seconds above 0 (validators see the text before conversion,
/// so they parse it themselves).
CLI::Validator positive_seconds();

/// --topology. `smt_fallback` says whether the command falls back to
/// synthetic siblings on a machine without SMT (see smt_topology() in common.hpp).
CLI::Option* add_topology_option(CLI::App& sub, std::string& topology, bool smt_fallback);

/// --policy core_vruntime|forceidle_balance; unset means the runtime's default.
CLI::Option* add_policy_option(CLI::App& sub, std::optional<FairnessPolicy>& policy);

/// --placement mask|scan; unset means the runtime's default.
CLI::Option* add_placement_option(CLI::App& sub, std::optional<Placement>& placement);

/// --slice-us N: Options::slice in microseconds; unset means the runtime's
/// default.
CLI::Option* add_slice_option(CLI::App& sub, std::optional<unsigned>& slice_us);

/// Two tenants' weights, as `--weights A:B` gives them (cgroup cpu.weight
/// semantics: each from Cookie::kMinWeight to Cookie::kMaxWeight).
using TenantWeights = std::array<std::uint32_t, 2>;

/// Parses "A:B" into two weights; nullopt, with the reason in `err`, for
/// anything else: one value, a third, a sign, a fraction, text, or a weight
/// outside 1..10000 (a cookie would refuse it mid-run, after the setup).
std::optional<TenantWeights> parse_weights(std::string_view text, std::string& err);

/// --weights A:B, checked by parse_weights() as the command line is read, so
/// bad input is a parse error (exit non-zero, the reason on stderr) before
/// any run starts. `roles` names the two tenants in the help ("CPU:MEM").
CLI::Option* add_weights_option(CLI::App& sub, std::optional<TenantWeights>& weights, const std::string& roles);

/// --json FILE.
CLI::Option* add_json_option(CLI::App& sub, std::string& path);

} // namespace coresched::bench
