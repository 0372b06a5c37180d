// SPDX-License-Identifier: Apache-2.0
#include "cli_options.hpp"
#include "common.hpp"

#include <coresched/cookie.hpp>
#include <fmt/format.h>

namespace coresched::bench {

CLI::Validator positive_seconds() {
  return CLI::Validator(
      [](std::string& v) {
        double d = 0;
        const bool ok = CLI::detail::lexical_cast(v, d) && d > 0 && d <= 1e6;
        return ok ? std::string() : std::string("must be a number of seconds above 0");
      },
      "SECONDS");
}

CLI::Option* add_topology_option(CLI::App& sub, std::string& topology, bool smt_fallback) {
  std::string help = "Topology: an hwloc synthetic string such as \"package:1 l3cache:1 core:1 pu:2\", an .xml "
                     "file, or empty for CORESCHED_TOPOLOGY / the real machine";
  if (smt_fallback) help += std::string(" (which, without SMT, falls back to \"") + synthetic_smt_topology + "\")";
  return sub.add_option("--topology", topology, help);
}

CLI::Option* add_policy_option(CLI::App& sub, std::optional<FairnessPolicy>& policy) {
  return sub
      .add_option_function<std::string>(
          "--policy",
          [&policy](const std::string& p) {
            policy = p == "forceidle_balance" ? FairnessPolicy::forceidle_balance : FairnessPolicy::core_vruntime;
          },
          "Fairness policy between cookies on a core (default: core_vruntime)")
      ->check(CLI::IsMember({to_string(FairnessPolicy::core_vruntime), to_string(FairnessPolicy::forceidle_balance)}));
}

CLI::Option* add_placement_option(CLI::App& sub, std::optional<Placement>& placement) {
  return sub
      .add_option_function<std::string>(
          "--placement",
          [&placement](const std::string& p) { placement = p == "scan" ? Placement::scan : Placement::mask; },
          "How a woken fiber finds an idle worker: mask (per-LLC idle bitmask) or scan (visit every worker); "
          "default: mask")
      ->check(CLI::IsMember({to_string(Placement::mask), to_string(Placement::scan)}));
}

CLI::Option* add_slice_option(CLI::App& sub, std::optional<unsigned>& slice_us) {
  // The ticker runs every quarter slice: below 100 us it would keep a CPU busy.
  return sub
      .add_option("--slice-us", slice_us, "The runtime's slice in microseconds, 100 to 1000000 (default: "
                                          "Options::slice, 1000)")
      ->check(CLI::Range(100u, 1'000'000u));
}

std::optional<TenantWeights> parse_weights(std::string_view text, std::string& err) {
  const auto colon = text.find(':');
  if (colon == std::string_view::npos || text.find(':', colon + 1) != std::string_view::npos) {
    err = "must be two weights, A:B (e.g. 300:100)";
    return std::nullopt;
  }
  TenantWeights w{};
  const std::string_view parts[2] = {text.substr(0, colon), text.substr(colon + 1)};
  for (std::size_t i = 0; i < 2; ++i) {
    // Digits only: strtoul would take "-1" as a huge number and " 5" or "5x" as 5.
    const std::string_view p = parts[i];
    const bool digits = !p.empty() && p.size() <= 6 && p.find_first_not_of("0123456789") == std::string_view::npos;
    const std::uint64_t v = digits ? std::stoull(std::string(p)) : 0;
    if (!digits || v < Cookie::kMinWeight || v > Cookie::kMaxWeight) {
      err = fmt::format("weight \"{}\" must be a whole number from {} to {}", p, Cookie::kMinWeight,
                        Cookie::kMaxWeight);
      return std::nullopt;
    }
    w[i] = static_cast<std::uint32_t>(v);
  }
  return w;
}

CLI::Option* add_weights_option(CLI::App& sub, std::optional<TenantWeights>& weights, const std::string& roles) {
  return sub
      .add_option_function<std::string>(
          "--weights", [&weights](const std::string& text) {
            std::string err;
            weights = parse_weights(text, err); // checked below: never unset here
          },
          "The tenants' weights, " + roles + ", each 1 to 10000 (cgroup cpu.weight; default 100:100): where they "
          "compete for a core each gets a share of its time proportional to its weight")
      ->check(CLI::Validator(
          [](std::string& text) {
            std::string err;
            return parse_weights(text, err) ? std::string() : err;
          },
          roles));
}

CLI::Option* add_json_option(CLI::App& sub, std::string& path) {
  return sub.add_option("--json", path, "Also write every figure, with units and per-run values, to FILE");
}

} // namespace coresched::bench
