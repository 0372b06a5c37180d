// SPDX-License-Identifier: Apache-2.0
// Topology::discover: the machine's allowed CPUs, synthetic strings, hwloc XML,
// CORESCHED_TOPOLOGY, and a clear error for bad input.
#include <coresched/topology.hpp>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <set>
#include <thread>

using coresched::Topology;
using coresched::TopologyError;

TEST_CASE("real machine topology uses only allowed CPUs", "[topology]") {
  const Topology t = Topology::discover("auto");
  REQUIRE(t.source() == Topology::Source::machine);
  REQUIRE(t.real_siblings());
  REQUIRE(!t.pus().empty());
  REQUIRE(t.pus().size() <= std::thread::hardware_concurrency());
  std::set<unsigned> cpus;
  for (const auto& pu : t.pus()) {
    CHECK(pu.cpu == pu.os_index);
    cpus.insert(pu.cpu);
  }
  CHECK(cpus.size() == t.pus().size());
  CHECK(t.describe().find("siblings: REAL") != std::string::npos);
}

TEST_CASE("synthetic topology: cores, siblings, LLCs, round-robin CPUs", "[topology]") {
  const Topology t = Topology::discover("package:2 l3cache:2 core:2 pu:2");
  REQUIRE(t.source() == Topology::Source::synthetic);
  CHECK_FALSE(t.real_siblings());
  CHECK(t.packages() == 2);
  CHECK(t.llcs().size() == 4);
  CHECK(t.cores().size() == 8);
  CHECK(t.pus().size() == 16);
  CHECK(t.max_siblings() == 2);
  for (const auto& c : t.cores()) {
    REQUIRE(c.pus.size() == 2);
    CHECK(t.pus()[c.pus[0]].core == c.index);
    CHECK(t.pus()[c.pus[1]].llc == c.llc);
  }
  const unsigned ncpu = std::thread::hardware_concurrency();
  std::set<unsigned> used;
  for (const auto& pu : t.pus()) used.insert(pu.cpu);
  CHECK(used.size() == std::min<std::size_t>(ncpu, 16));
  CHECK(t.describe().find("siblings: SYNTHETIC") != std::string::npos);
}

TEST_CASE("XML topologies from tests/data", "[topology]") {
  const Topology smt2 = Topology::discover(CORESCHED_TEST_DATA "/2pkg-4llc-48core-smt2.xml");
  CHECK(smt2.source() == Topology::Source::xml);
  CHECK(smt2.cores().size() == 48);
  CHECK(smt2.pus().size() == 96);
  CHECK(smt2.llcs().size() == 4);
  const Topology smt4 = Topology::discover(CORESCHED_TEST_DATA "/1pkg-4core-smt4.xml");
  CHECK(smt4.max_siblings() == 4);
  CHECK(smt4.cores().size() == 4);
  CHECK_FALSE(smt4.real_siblings());
}

TEST_CASE("CORESCHED_TOPOLOGY selects the topology when the spec is auto", "[topology]") {
  ::setenv("CORESCHED_TOPOLOGY", "core:3 pu:2", 1);
  const Topology t = Topology::discover("");
  ::unsetenv("CORESCHED_TOPOLOGY");
  CHECK(t.source() == Topology::Source::synthetic);
  CHECK(t.cores().size() == 3);
}

TEST_CASE("bad topology input gets a clear error", "[topology]") {
  CHECK_THROWS_WITH(Topology::discover("package:1 banana:7"), Catch::Contains("cannot parse hwloc synthetic"));
  CHECK_THROWS_WITH(Topology::discover("/nonexistent/topo.xml"), Catch::Contains("does not exist"));
  CHECK_THROWS_AS(Topology::discover(CORESCHED_TEST_DATA "/invalid.xml"), TopologyError);
}
