// The in-flight controller against a modelled store: a link with a round-trip time and a
// server with a capacity. Throughput = min(depth / round trip, capacity); beyond capacity
// the server queues, so the first byte comes later the deeper the pipe (the feedback that
// sizing by measured latency alone falls into).
#include "io/inflight_controller.h"

#include <algorithm>
#include <cmath>

#include "gtest/gtest.h"

namespace wharf {
namespace {

constexpr double kObject = 64 * 1024;

struct Model {
  double rtt = 0.001;       // seconds
  double capacity = 150e6;  // bytes/s the server can serve
  double demand = 1e18;     // bytes/s the consumer takes (the engine fills the pipe)
  // Above this depth the server serves less the deeper its queue (0: no such penalty):
  // capacity x (1 - penalty x log2(depth / knee)), as RGW on two cores at 0 ms.
  int knee = 0;
  double penalty = 0.02;

  double Capacity(int depth) const {
    if (knee == 0 || depth <= knee) return capacity;
    return capacity * (1 - penalty * std::log2(static_cast<double>(depth) / knee));
  }
  // Steady throughput and first-byte time at `depth`.
  double Rate(int depth) const {
    return std::min({depth * kObject / rtt, Capacity(depth), demand});
  }
  double Ttfb(int depth) const {
    const double served = Rate(depth) / kObject;  // objects/s
    return std::max(rtt, depth / served);         // Little: depth / rate, at least the RTT
  }
};

// Runs the model for `seconds` in 1 ms steps; returns the mean throughput of the last
// `tail_ms`.
double Simulate(InFlightController& c, const Model& m, double seconds, double& clock,
                int tail_ms = 1000) {
  double carry = 0, last_bytes = 0;
  const int tail = std::min(static_cast<int>(seconds * 1000), tail_ms);
  const int steps = static_cast<int>(seconds * 1000);
  for (int i = 0; i < steps; ++i) {
    clock += 0.001;
    const int depth = c.limit();
    const double objects = m.Rate(depth) / kObject * 0.001 + carry;
    const int n = static_cast<int>(objects);
    carry = objects - n;
    const bool full = m.Rate(depth) < m.demand;
    for (int k = 0; k < n; ++k) {
      c.OnComplete(static_cast<int64_t>(clock * 1e9), static_cast<uint64_t>(kObject),
                   absl::Seconds(m.Ttfb(depth)), full ? depth : depth / 2);
    }
    if (i >= steps - tail) last_bytes += n * kObject;
  }
  return last_bytes / (tail / 1000.0);
}

InFlightController::Options Defaults(int initial) {
  InFlightController::Options o;
  o.initial = initial;
  return o;
}

TEST(InFlightController, ClimbsToTheDepthAFarStoreNeeds) {
  InFlightController c(Defaults(32));
  Model m;
  m.rtt = 0.2;  // 100 ms each way: 150 MB/s needs ~460 requests in flight
  double clock = 0;
  const double rate = Simulate(c, m, 12, clock);
  EXPECT_GE(rate, 0.9 * m.capacity) << "depth " << c.limit();
  EXPECT_LE(c.limit(), 4096);
}

TEST(InFlightController, StaysShallowWhenTheServerIsTheBottleneck) {
  // Loopback: the server saturates at ~20 requests; deeper only queues (and inflates the
  // first-byte time, which must not pull the depth up).
  InFlightController c(Defaults(380));
  Model m;
  m.rtt = 0.008;
  double clock = 0;
  const double rate = Simulate(c, m, 20, clock, 5000);  // probes included
  EXPECT_GE(rate, 0.9 * m.capacity);
  EXPECT_LT(c.limit(), 150) << "it should have walked down from 380";
}

TEST(InFlightController, WalksDownQuicklyFromADepthFarAboveWhatTheLinkNeeds) {
  // Loopback with a server that loses ~2% per doubling of its queue past 16 (ADAPT's first
  // phase: the best fixed depth at 0 ms was 16, the engine starts at the prior's 380).
  InFlightController c(Defaults(380));
  Model m;
  m.rtt = 0.0005;
  m.knee = 16;
  double clock = 0;
  // Its first probe goes up (760, no gain), then it walks down: steps of 1.5, then 2.25
  // while they are kept (253, 112, 49, 21, 9; eight steps of 1.5 were at 49 by now).
  Simulate(c, m, 5.5, clock);
  EXPECT_LE(c.limit(), 40) << "5.5 s in";
  EXPECT_GE(Simulate(c, m, 5, clock, 5000), 0.95 * m.capacity) << "depth " << c.limit();
}

// Seconds (in whole 1 s windows) until a window reaches 90% of the capacity; 99 if none
// does within `limit` seconds.
int SecondsToReach(InFlightController& c, const Model& m, double& clock, int limit) {
  for (int s = 1; s <= limit; ++s) {
    if (Simulate(c, m, 1, clock) >= 0.9 * m.capacity) return s;
  }
  return 99;
}

TEST(InFlightController, FollowsTheLatencyUpAndDownWithinSeconds) {
  InFlightController c(Defaults(64));
  Model m;
  m.rtt = 0.002;
  double clock = 0;
  Simulate(c, m, 8, clock);
  m.rtt = 0.05;  // the proxy goes from 1 to 25 ms each way
  EXPECT_LE(SecondsToReach(c, m, clock, 10), 5) << "depth " << c.limit();
  m.rtt = 0.2;  // ... to 100 ms
  EXPECT_LE(SecondsToReach(c, m, clock, 10), 5) << "depth " << c.limit();
  Simulate(c, m, 10, clock);
  EXPECT_GE(Simulate(c, m, 10, clock, 10000), 0.9 * m.capacity) << "settled, probes included";
  m.rtt = 0.002;  // and back
  EXPECT_LE(SecondsToReach(c, m, clock, 10), 5) << "depth " << c.limit();
  Simulate(c, m, 20, clock);
  EXPECT_LT(c.limit(), 512) << "a near store again: the depth comes back down";
}

TEST(InFlightController, AConsumerBoundEngineIsLeftAlone) {
  InFlightController c(Defaults(64));
  Model m;
  m.rtt = 0.2;
  m.demand = 10e6;  // the consumer, not the depth, bounds it
  double clock = 0;
  Simulate(c, m, 10, clock);
  EXPECT_LE(c.limit(), 64);
  EXPECT_EQ(c.stats().probes, 0);
}

}  // namespace
}  // namespace wharf
