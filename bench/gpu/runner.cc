// fusor-gpu-check: the GPU half of the device check (bench/gpu/run.sh).
// Plain C++17 over the worker's CUDA backend (worker/cuda/gpu_runtime.cc,
// with the driver, NVRTC and cuBLAS loaded at run time), so it builds
// where only the NVIDIA driver and a pip PyTorch are installed.
//
// For every chain prepared by fusor-bench-gpu-prep it measures the fused
// candidates and the unfused baseline. Each is compiled for this GPU
// (all of a chain's programs at once, on every core), rejected if it
// spills or does not fit, validated element by element against the
// float64 reference on poisoned outputs, and timed with CUDA events after
// warm-up, the L2 flushed before every run. The fastest valid candidate
// is the chain's tuned kernel.
//
// The measuring runs in child processes (supervise.h): a kernel that
// faults or hangs costs its own row, and the run keeps its deadline. This
// process never touches the GPU itself. Prints one line per measurement,
// then RESULT lines for run.sh's table.
#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/gpu/inputs.h"
#include "bench/gpu/supervise.h"
#include "common/codegen/cuda/program.h"
#include "worker/cuda/gpu_runtime.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

namespace rt {
#include "common/codegen/cpu/prelude.inc"
}  // namespace rt

namespace {

using fusor::codegen::Program;
using fusor::gpu::LoadedProgram;
using fusor::gpu::Runtime;

std::string Read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct Manifest {
  std::string chain, dtype;
  uint64_t seed = 0;
  double tolerance = 0, flops = 0, min_bytes = 0;
  std::vector<int64_t> inputs, outputs;  // elements
};

bool ReadManifest(const std::string& path, Manifest* m) {
  std::istringstream in(Read(path));
  std::string key;
  while (in >> key) {
    if (key == "chain") in >> m->chain;
    else if (key == "dtype") in >> m->dtype;
    else if (key == "seed") in >> m->seed;
    else if (key == "tolerance") in >> m->tolerance;
    else if (key == "flops") in >> m->flops;
    else if (key == "min_bytes") in >> m->min_bytes;
    else if (key == "inputs" || key == "outputs") {
      size_t n = 0;
      in >> n;
      for (size_t i = 0; i < n; ++i) {
        std::string name;
        int64_t elements = 0;
        in >> name >> elements;
        (key == "inputs" ? m->inputs : m->outputs).push_back(elements);
      }
    } else {
      return false;
    }
  }
  return !m->chain.empty() && !m->inputs.empty() && !m->outputs.empty();
}

int Bytes(const std::string& dtype) { return dtype == "f32" ? 4 : 2; }

std::vector<unsigned char> Encode(const std::string& dtype, const std::vector<double>& values) {
  std::vector<unsigned char> out(values.size() * Bytes(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = static_cast<float>(values[i]);
    if (dtype == "f32") {
      std::memcpy(&out[4 * i], &f, 4);
    } else {
      const uint16_t h = dtype == "f16" ? rt::fusor_f32_to_f16(f) : rt::fusor_f32_to_bf16(f);
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

double Decode(const std::string& dtype, const unsigned char* p, int64_t i) {
  if (dtype == "f32") {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return dtype == "f16" ? rt::fusor_f16_to_f32(h) : rt::fusor_bf16_to_f32(h);
}

// One item of a chain: a candidate or the baseline, parsed and compiled
// here before any child starts (NVRTC needs no GPU).
struct Item {
  std::string name;
  std::string text;  // the program as the prep tool wrote it
  Program program;
  fusor::codegen::CompiledProgram compiled;
  std::string error;  // why it cannot run ("" when compiled)
  std::string what;
};

struct Device {
  std::string arch;
  fusor::codegen::DeviceLimits limits;
  double copy_Bps = 0, mma_flops = 0;
};

// Parses and compiles every item, on all cores.
void CompileItems(std::vector<Item>& items, const Device& device, const std::string& header) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < items.size();) {
      Item& item = items[i];
      if (!fusor::codegen::ProgramFromText(item.text, &item.program, &item.error)) continue;
      item.what = item.program.steps.size() == 1 ? item.program.steps[0].what
                                                 : std::to_string(item.program.steps.size()) + " steps";
      if (!fusor::codegen::CompileProgram(item.program, device.arch, header, device.limits, &item.compiled,
                                          &item.error)) {
        item.error = "rejected: " + item.error;
      }
    }
  };
  const unsigned threads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 16));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(work);
  for (std::thread& t : pool) t.join();
}

// Validates and times one compiled item; "" or why not. `median_s` and
// `max_rel` on success.
std::string MeasureOne(Runtime& gpu, const Item& item, const Manifest& m,
                       const std::vector<fusor::gpu::DevicePtr>& in, const std::vector<fusor::gpu::DevicePtr>& out,
                       const std::vector<float>& expected, double seconds, double* median_s, double* max_rel) {
  std::string why;
  LoadedProgram loaded;
  if (!loaded.Prepare(gpu, item.program, item.compiled, &why)) return "rejected: " + why;
  const int bytes = Bytes(m.dtype);
  for (size_t o = 0; o < out.size(); ++o) {
    if (!gpu.Fill(out[o], 0xff, m.outputs[o] * bytes, &why)) return why;
  }
  if (!loaded.Run(in, out, &why) || !gpu.Synchronize(&why)) return why;
  // Every element against the reference: |got - ref| <= tol (|ref| + rms).
  size_t at = 0;
  *max_rel = 0;
  for (size_t o = 0; o < out.size(); ++o) {
    std::vector<unsigned char> host(m.outputs[o] * bytes);
    if (!gpu.Download(host.data(), out[o], host.size(), &why)) return why;
    double sq = 0;
    for (int64_t i = 0; i < m.outputs[o]; ++i) sq += double(expected[at + i]) * expected[at + i];
    const double rms = std::sqrt(sq / std::max<int64_t>(1, m.outputs[o]));
    for (int64_t i = 0; i < m.outputs[o]; ++i) {
      const double ref = expected[at + i], got = Decode(m.dtype, host.data(), i);
      const double rel = std::fabs(got - ref) / (std::fabs(ref) + rms + 1e-30);
      if (!std::isfinite(got) || !(rel <= m.tolerance)) {
        return "invalid: output " + std::to_string(o) + " element " + std::to_string(i) + " got " +
               std::to_string(got) + ", expected " + std::to_string(ref);
      }
      *max_rel = std::max(*max_rel, rel);
    }
    at += m.outputs[o];
  }
  fusor::gpu::TimingPlan plan;
  plan.warmup = 3;
  plan.min_repeats = 10;
  plan.max_repeats = 1000;
  plan.time_budget_s = seconds;
  std::vector<double> samples;
  if (!gpu.Time([&](std::string* w) { return loaded.Run(in, out, w); }, plan, &samples, &why)) return why;
  *median_s = fusor::gpu::Median(samples);
  return "";
}

// Only a kernel refused before it ran leaves the child as it was. After a
// launch or execution failure the context may be unusable, and after
// wrong output the inputs may have been overwritten: the child stops and
// a new one (fresh context, inputs uploaded again) takes the next item.
bool Recoverable(const std::string& error) { return error.rfind("rejected: ", 0) == 0; }

// The child's side of a chain: its own context and buffers, then items
// from `from` on.
void MeasureChain(int from, fusor::bench::ItemChannel& channel, const std::string& header,
                  const std::vector<Item>& items, const Manifest& m, const std::vector<float>& expected,
                  double seconds) {
  std::string why;
  auto gpu = Runtime::Open(0, header, &why);
  if (gpu == nullptr) return channel.Abort("no GPU: " + why);
  std::vector<fusor::gpu::DevicePtr> in, out;
  for (size_t i = 0; i < m.inputs.size(); ++i) {
    std::vector<unsigned char> bytes =
        Encode(m.dtype, fusor::bench::DeviceCheckInput(m.seed, static_cast<int>(i), m.inputs[i]));
    in.push_back(gpu->Alloc(bytes.size(), &why));
    if (in.back() == 0 || !gpu->Upload(in.back(), bytes.data(), bytes.size(), &why)) {
      return channel.Abort("cannot set up the inputs: " + why);
    }
  }
  for (int64_t elements : m.outputs) {
    out.push_back(gpu->Alloc(elements * Bytes(m.dtype), &why));
    if (out.back() == 0) return channel.Abort("cannot set up the outputs: " + why);
  }
  for (int i = from; i < static_cast<int>(items.size()); ++i) {
    channel.Begin(i);
    double median_s = 0, max_rel = 0;
    std::string error = items[i].error;
    if (error.empty()) error = MeasureOne(*gpu, items[i], m, in, out, expected, seconds, &median_s, &max_rel);
    char numbers[64];
    std::snprintf(numbers, sizeof(numbers), "%.3f %.2e ", median_s * 1e6, max_rel);
    channel.Done(i, (error.empty() ? "ok " : "FAIL ") + std::string(numbers) +
                        (error.empty() ? items[i].what : error.substr(0, 300)));
    if (!error.empty() && !Recoverable(error)) return;
  }
}

// The device, described and calibrated in a child.
bool DescribeDevice(const std::string& header, Device* device) {
  const auto outcome = fusor::bench::SuperviseItems(1, {120, 0}, [&](int, fusor::bench::ItemChannel& channel) {
    std::string why;
    auto gpu = Runtime::Open(0, header, &why);
    if (gpu == nullptr) return channel.Abort("no GPU: " + why);
    channel.Begin(0);
    const fusor::gpu::DeviceInfo& info = gpu->info();
    const fusor::codegen::DeviceLimits limits = gpu->limits();
    const double copy = gpu->CopyBandwidth(0.5, &why);
    const double mma = copy > 0 ? gpu->MmaRate(0.5, &why) : 0;
    std::printf("DEVICE %s %s SMs=%d L2=%lld MiB shared=%lld KiB driver=%d\n", info.name.c_str(), info.arch.c_str(),
                info.sm_count, (long long)(info.l2_bytes >> 20), (long long)(info.shared_optin_bytes >> 10),
                info.driver_version);
    std::printf("CEILING copy_TBps=%.3f mma_f16_TFLOPs=%.1f%s\n", copy / 1e12, mma / 1e12,
                mma > 0 ? "" : ("  calibration failed: " + why).c_str());
    std::fflush(stdout);
    char text[256];
    std::snprintf(text, sizeof(text), "%s %d %lld %lld %.6g %.6g", info.arch.c_str(), limits.max_threads_per_block,
                  (long long)limits.registers_per_sm, (long long)limits.max_shared_per_block, copy, mma);
    channel.Done(0, text);
  });
  if (outcome[0].state != fusor::bench::ItemOutcome::State::kDone) {
    std::fprintf(stderr, "%s\n", outcome[0].text.c_str());
    return false;
  }
  std::istringstream in(outcome[0].text);
  in >> device->arch >> device->limits.max_threads_per_block >> device->limits.registers_per_sm >>
      device->limits.max_shared_per_block >> device->copy_Bps >> device->mma_flops;
  return !in.fail();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  double seconds = 0.2, deadline_s = 0, item_timeout_s = 30;
  std::string dry_run_arch;
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const bool has_value = i + 1 < args.size();
    if (args[i] == "--seconds" && has_value) seconds = std::atof(args[++i].c_str());
    else if (args[i] == "--deadline" && has_value) deadline_s = std::atof(args[++i].c_str());
    else if (args[i] == "--item-timeout" && has_value) item_timeout_s = std::atof(args[++i].c_str());
    else if (args[i] == "--dry-run-arch" && has_value) dry_run_arch = args[++i];
    else positional.push_back(args[i]);
  }
  if (positional.size() != 2) {
    std::fprintf(stderr,
                 "usage: fusor-gpu-check PREP_DIR DEVICE_HEADER [--seconds S_PER_KERNEL] [--deadline S]\n"
                 "                       [--item-timeout S] [--dry-run-arch sm_90]\n"
                 "--dry-run-arch: compile for that arch without asking the device first (the measuring\n"
                 "still needs one); exits 3 when there is none, as without it.\n");
    return 2;
  }
  const std::string root = positional[0];
  const std::string header = Read(positional[1]);
  if (header.empty()) {
    std::fprintf(stderr, "cannot read the device header %s\n", positional[1].c_str());
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  Device device;
  if (!dry_run_arch.empty()) {
    device.arch = dry_run_arch;
    device.limits = fusor::codegen::LimitsForArch(dry_run_arch);
  } else if (!DescribeDevice(header, &device)) {
    return 3;  // it said why (no GPU: ...)
  }

  std::vector<std::string> chains;
  if (DIR* d = opendir(root.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') chains.push_back(e->d_name);
    }
    closedir(d);
  }
  std::sort(chains.begin(), chains.end());
  int failures = 0;
  bool no_device = false;
  for (const std::string& name : chains) {
    const std::string dir = root + "/" + name;
    Manifest m;
    if (!ReadManifest(dir + "/manifest.txt", &m)) continue;
    const std::string raw = Read(dir + "/expected.f32");
    int64_t outputs = 0;
    for (int64_t elements : m.outputs) outputs += elements;
    if (static_cast<int64_t>(raw.size()) != 4 * outputs) {
      std::printf("CHAIN %s: skipped: expected.f32 holds %zu bytes, not the %lld of its outputs\n", name.c_str(),
                  raw.size(), static_cast<long long>(4 * outputs));
      ++failures;
      continue;
    }
    std::vector<float> expected(raw.size() / 4);
    std::memcpy(expected.data(), raw.data(), expected.size() * 4);
    std::vector<Item> items;
    for (int i = 0;; ++i) {
      std::string name = "candidate_" + std::to_string(i), text = Read(dir + "/" + name + ".prog");
      if (text.empty()) break;
      items.emplace_back().name = name;
      items.back().text = text;
    }
    items.emplace_back().name = "baseline";
    items.back().text = Read(dir + "/baseline.prog");
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (deadline_s > 0 && elapsed >= deadline_s) {
      std::printf("CHAIN %s: skipped: the run's deadline passed\n", name.c_str());
      ++failures;
      continue;
    }
    CompileItems(items, device, header);
    fusor::bench::SuperviseOptions options;
    options.item_timeout_s = item_timeout_s;
    if (deadline_s > 0) {
      options.deadline_s = deadline_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (options.deadline_s <= 0) options.deadline_s = 1e-3;
    }
    const auto outcomes = fusor::bench::SuperviseItems(
        static_cast<int>(items.size()), options, [&](int from, fusor::bench::ItemChannel& channel) {
          MeasureChain(from, channel, header, items, m, expected, seconds);
        });
    // Each outcome: "ok|FAIL <median us> <max rel> <what or why>" from the
    // child, or the supervisor's word on an item that never reported.
    double best_us = -1, base_us = -1;
    std::string best = "none";
    for (size_t i = 0; i < items.size(); ++i) {
      std::string verdict = "FAIL", rest;
      double us = 0, rel = 0;
      if (outcomes[i].state == fusor::bench::ItemOutcome::State::kDone) {
        std::istringstream line(outcomes[i].text);
        line >> verdict >> us >> rel;
        if (line.fail() || (verdict == "ok" && !(us > 0))) verdict = "FAIL";  // unreadable, or no samples
        std::getline(line >> std::ws, rest);
      } else {
        // A compile error says more than the fate of the child that never ran it.
        rest = !items[i].error.empty()
                   ? items[i].error.substr(0, 300)
                   : std::string(fusor::bench::StateName(outcomes[i].state)) + ": " + outcomes[i].text;
        no_device |= outcomes[i].text.rfind("no GPU", 0) == 0;
      }
      std::printf("MEASURE %s %s %s %.2f us  max_rel %.1e  %s\n", name.c_str(), items[i].name.c_str(),
                  verdict.c_str(), us, rel, rest.c_str());
      if (verdict != "ok") continue;
      if (i + 1 == items.size()) {
        base_us = us;
      } else if (best_us < 0 || us < best_us) {
        best_us = us;
        best = items[i].name;
      }
    }
    if (best_us < 0 || base_us < 0) ++failures;
    std::printf("RESULT chain=%s fused_us=%.3f baseline_us=%.3f flops=%.6g min_bytes=%.6g copy_Bps=%.6g "
                "mma_flops=%.6g best=%s\n",
                name.c_str(), best_us, base_us, m.flops, m.min_bytes, device.copy_Bps, device.mma_flops,
                best.c_str());
    std::fflush(stdout);
  }
  if (no_device) return 3;
  return failures == 0 ? 0 : 1;
}
