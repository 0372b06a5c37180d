// SPDX-License-Identifier: Apache-2.0
#pragma once
/// @file cli_options.hpp
/// Command-line options several subcommands share, so each spells its
/// --topology, --policy, --placement, --slice-us and --json the same way.

#include <coresched/options.hpp>

#include <CLI/CLI.hpp>

#include <optional>
#include <string>

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

/// --json FILE.
CLI::Option* add_json_option(CLI::App& sub, std::string& path);

} // namespace coresched::bench
