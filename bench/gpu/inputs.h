// Deterministic inputs for the GPU device check, in plain C++: the prep
// tool (here) computes the float64 reference from them and the runner (on
// the GPU machine) generates the same values, so only the expected outputs
// travel. splitmix64, then uniform in [-1, 1).
#pragma once

#include <cstdint>
#include <vector>

namespace fusor::bench {

inline std::vector<double> DeviceCheckInput(uint64_t seed, int input, int64_t elements) {
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(input + 1) * 0xbf58476d1ce4e5b9ull;
  std::vector<double> values(static_cast<size_t>(elements));
  for (double& v : values) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    v = static_cast<double>(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
  }
  return values;
}

}  // namespace fusor::bench
