// fusor-gpu-check: the GPU half of the device check (bench/gpu/run.sh).
// Plain C++17 over the worker's CUDA backend (worker/cuda/gpu_runtime.cc,
// NVRTC and cuBLAS loaded at run time), so it builds where only CUDA is
// installed. For every chain prepared by fusor-bench-gpu-prep it measures
// the fused candidates and the unfused baseline: each is compiled for this
// GPU, rejected if it spills or does not fit, validated element by element
// against the float64 reference on poisoned outputs, and timed with CUDA
// events after warm-up, the L2 flushed before every run. The fastest valid
// candidate is the chain's tuned kernel. One line per measurement, then
// RESULT lines for run.sh.
#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "bench/gpu/inputs.h"
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

struct Measured {
  std::string name, what, error;
  bool ok = false;
  double median_s = 0, max_rel = 0;
};

// `text`: a program (program.h) as the prep tool wrote it.
Measured MeasureOne(Runtime& gpu, const std::string& text, const std::string& name, const Manifest& m, const std::vector<CUdeviceptr>& in, const std::vector<CUdeviceptr>& out,
                    const std::vector<float>& expected, double seconds) {
  Measured r;
  r.name = name;
  Program program;
  if (!fusor::codegen::ProgramFromText(text, &program, &r.error)) return r;
  r.what = program.steps.size() == 1 ? program.steps[0].what : std::to_string(program.steps.size()) + " steps";
  fusor::codegen::CompiledProgram compiled;
  if (!fusor::codegen::CompileProgram(program, gpu.info().arch, gpu.device_header(), gpu.limits(), &compiled,
                                      &r.error)) {
    r.error = "rejected: " + r.error;
    return r;
  }
  LoadedProgram loaded;
  if (!loaded.Prepare(gpu, program, compiled, &r.error)) {
    r.error = "rejected: " + r.error;
    return r;
  }
  const int bytes = Bytes(m.dtype);
  for (size_t o = 0; o < out.size(); ++o) {
    if (!gpu.Fill(out[o], 0xff, m.outputs[o] * bytes, &r.error)) return r;
  }
  if (!loaded.Run(in, out, &r.error) || !gpu.Synchronize(&r.error)) return r;
  // Every element against the reference: |got - ref| <= tol (|ref| + rms).
  size_t at = 0;
  for (size_t o = 0; o < out.size(); ++o) {
    std::vector<unsigned char> host(m.outputs[o] * bytes);
    if (!gpu.Download(host.data(), out[o], host.size(), &r.error)) return r;
    double sq = 0;
    for (int64_t i = 0; i < m.outputs[o]; ++i) sq += double(expected[at + i]) * expected[at + i];
    const double rms = std::sqrt(sq / std::max<int64_t>(1, m.outputs[o]));
    for (int64_t i = 0; i < m.outputs[o]; ++i) {
      const double ref = expected[at + i], got = Decode(m.dtype, host.data(), i);
      const double rel = std::fabs(got - ref) / (std::fabs(ref) + rms + 1e-30);
      if (!std::isfinite(got) || !(rel <= m.tolerance)) {
        r.error = "invalid: output " + std::to_string(o) + " element " + std::to_string(i) + " got " +
                  std::to_string(got) + ", expected " + std::to_string(ref);
        return r;
      }
      r.max_rel = std::max(r.max_rel, rel);
    }
    at += m.outputs[o];
  }
  fusor::gpu::TimingPlan plan;
  plan.warmup = 3;
  plan.min_repeats = 10;
  plan.max_repeats = 1000;
  plan.time_budget_s = seconds;
  std::vector<double> samples;
  if (!gpu.Time([&](std::string* w) { return loaded.Run(in, out, w); }, plan, &samples, &r.error)) return r;
  r.median_s = fusor::gpu::Median(samples);
  r.ok = true;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: fusor-gpu-check PREP_DIR DEVICE_HEADER [SECONDS_PER_KERNEL]\n");
    return 2;
  }
  const std::string root = argv[1];
  const std::string header = Read(argv[2]);
  const double seconds = argc > 3 ? std::atof(argv[3]) : 0.2;
  if (header.empty()) {
    std::fprintf(stderr, "cannot read the device header %s\n", argv[2]);
    return 2;
  }
  std::string why;
  auto gpu = Runtime::Open(0, header, &why);
  if (gpu == nullptr) {
    std::fprintf(stderr, "no GPU: %s\n", why.c_str());
    return 3;
  }
  const double copy = gpu->CopyBandwidth(0.5, &why);
  const double mma = gpu->MmaRate(0.5, &why);
  std::printf("DEVICE %s %s SMs=%d L2=%lld MiB shared=%lld KiB driver=%d\n", gpu->info().name.c_str(),
              gpu->info().arch.c_str(), gpu->info().sm_count, (long long)(gpu->info().l2_bytes >> 20),
              (long long)(gpu->info().shared_optin_bytes >> 10), gpu->info().driver_version);
  std::printf("CEILING copy_TBps=%.3f mma_f16_TFLOPs=%.1f\n", copy / 1e12, mma / 1e12);

  std::vector<std::string> chains;
  if (DIR* d = opendir(root.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] != '.') chains.push_back(e->d_name);
    }
    closedir(d);
  }
  std::sort(chains.begin(), chains.end());
  int failures = 0;
  for (const std::string& name : chains) {
    const std::string dir = root + "/" + name;
    Manifest m;
    if (!ReadManifest(dir + "/manifest.txt", &m)) continue;
    const std::string raw = Read(dir + "/expected.f32");
    std::vector<float> expected(raw.size() / 4);
    std::memcpy(expected.data(), raw.data(), expected.size() * 4);
    std::vector<CUdeviceptr> in, out;
    bool ok = true;
    for (size_t i = 0; i < m.inputs.size() && ok; ++i) {
      std::vector<unsigned char> bytes =
          Encode(m.dtype, fusor::bench::DeviceCheckInput(m.seed, static_cast<int>(i), m.inputs[i]));
      in.push_back(gpu->Alloc(bytes.size(), &why));
      ok = in.back() != 0 && gpu->Upload(in.back(), bytes.data(), bytes.size(), &why);
    }
    for (int64_t elements : m.outputs) {
      out.push_back(gpu->Alloc(elements * Bytes(m.dtype), &why));
      ok = ok && out.back() != 0;
    }
    if (!ok) {
      std::printf("CHAIN %s: cannot set up buffers: %s\n", name.c_str(), why.c_str());
      ++failures;
      continue;
    }
    Measured best;
    for (int i = 0;; ++i) {
      const std::string text = Read(dir + "/candidate_" + std::to_string(i) + ".prog");
      if (text.empty()) break;
      Measured r = MeasureOne(*gpu, text, "candidate_" + std::to_string(i), m, in, out, expected, seconds);
      std::printf("MEASURE %s %s %s %.2f us  max_rel %.1e  %s\n", name.c_str(), r.name.c_str(), r.ok ? "ok" : "FAIL",
                  r.median_s * 1e6, r.max_rel, r.ok ? r.what.c_str() : r.error.substr(0, 300).c_str());
      if (r.ok && (!best.ok || r.median_s < best.median_s)) best = r;
    }
    Measured base = MeasureOne(*gpu, Read(dir + "/baseline.prog"), "baseline", m, in, out, expected, seconds);
    std::printf("MEASURE %s baseline %s %.2f us  max_rel %.1e  %s\n", name.c_str(), base.ok ? "ok" : "FAIL",
                base.median_s * 1e6, base.max_rel, base.ok ? base.what.c_str() : base.error.substr(0, 300).c_str());
    if (!best.ok || !base.ok) ++failures;
    std::printf("RESULT chain=%s fused_us=%.3f baseline_us=%.3f flops=%.6g min_bytes=%.6g copy_Bps=%.6g "
                "mma_flops=%.6g best=%s\n",
                name.c_str(), best.ok ? best.median_s * 1e6 : -1.0, base.ok ? base.median_s * 1e6 : -1.0, m.flops,
                m.min_bytes, copy, mma, best.ok ? best.name.c_str() : "none");
    for (CUdeviceptr p : in) gpu->Free(p);
    for (CUdeviceptr p : out) gpu->Free(p);
  }
  return failures == 0 ? 0 : 1;
}
