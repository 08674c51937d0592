#include "common/hw/devices.h"

#include <algorithm>
#include <cctype>

namespace fusor::hw {
namespace {

struct Entry {
  const char* key;
  const char* device_name;
  const char* arch;
  int sms;
  double bandwidth;  // bytes/s
  double peak;       // dense f16/bf16 tensor FLOP/s
  int64_t smem;      // opt-in shared memory per block
  int64_t l2;
};

// Datasheet figures (REFERENCES.md, marked lead there).
constexpr Entry kDevices[] = {
    {"v100", "NVIDIA V100", "sm_70", 80, 0.9e12, 125e12, 96 << 10, 6 << 20},
    {"a100", "NVIDIA A100 SXM 80GB", "sm_80", 108, 2.0e12, 312e12, 163 << 10, 40 << 20},
    {"rtx3080", "NVIDIA GeForce RTX 3080", "sm_86", 68, 0.76e12, 119e12, 99 << 10, 5 << 20},
    {"rtx4090", "NVIDIA GeForce RTX 4090", "sm_89", 128, 1.0e12, 330e12, 99 << 10, 72 << 20},
    {"l4", "NVIDIA L4", "sm_89", 58, 0.3e12, 121e12, 99 << 10, 48 << 20},
    {"h100", "NVIDIA H100 SXM", "sm_90", 132, 3.35e12, 989e12, 227 << 10, 50 << 20},
    {"h200", "NVIDIA H200", "sm_90", 132, 4.8e12, 989e12, 227 << 10, 60 << 20},
};

std::string Lower(absl::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  std::erase(out, ' ');
  return out;
}

TargetDesc FromEntry(const Entry& e) {
  TargetDesc t;
  t.backend = Backend::kCuda;
  t.arch = e.arch;
  t.device_name = e.device_name;
  t.compute_units = e.sms;
  t.shared_mem_per_block = e.smem;
  t.l2_bytes = e.l2;
  return t;
}

}  // namespace

std::optional<TargetDesc> LookupDevice(absl::string_view name) {
  const std::string key = Lower(name);
  for (const Entry& e : kDevices) {
    if (key == e.key) return FromEntry(e);
  }
  return std::nullopt;
}

std::vector<std::string> DeviceNames() {
  std::vector<std::string> names;
  for (const Entry& e : kDevices) names.push_back(e.key);
  return names;
}

const char* RateSourceName(RateSource source) {
  switch (source) {
    case RateSource::kCalibrated: return "calibrated";
    case RateSource::kDeviceTable: return "device table";
    case RateSource::kEstimate: return "estimate";
  }
  return "?";
}

ModelRates RatesFor(const TargetDesc& target) {
  ModelRates r;
  r.compute_units = std::max(target.compute_units, 1);
  if (target.bandwidth_bytes_per_s > 0 && target.peak_flops > 0) {
    r.bandwidth_bytes_per_s = target.bandwidth_bytes_per_s;
    r.peak_flops = target.peak_flops;
    r.source = RateSource::kCalibrated;
    return r;
  }
  const std::string name = Lower(target.device_name);
  for (const Entry& e : kDevices) {
    if (target.backend == Backend::kCuda && name.find(e.key) != std::string::npos) {
      r.bandwidth_bytes_per_s = e.bandwidth;
      r.peak_flops = e.peak;
      if (target.compute_units <= 0) r.compute_units = e.sms;
      r.source = RateSource::kDeviceTable;
      return r;
    }
  }
  if (target.backend == Backend::kCuda) {
    r.bandwidth_bytes_per_s = 1e12;
    r.peak_flops = 100e12;
  } else {
    // Two FMA pipes of `lanes` f32 at ~2.5 GHz per core; ~10 GB/s per core
    // of memory bandwidth, at most 100 GB/s.
    const double lanes = std::max(target.vector_lanes_f32, 1);
    r.peak_flops = r.compute_units * lanes * 2 * 2 * 2.5e9;
    r.bandwidth_bytes_per_s = std::min(100e9, 10e9 * r.compute_units);
  }
  return r;
}

}  // namespace fusor::hw
