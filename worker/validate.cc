#include "worker/validate.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <optional>
#include <random>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/codegen/cpu/prelude.h"
#include "common/ir/parse.h"
#include "common/ir/reference.h"
#include "common/util/files.h"
#include "common/util/sha256.h"
#include "common/util/status_macros.h"

namespace fusor::worker {
namespace {

namespace rt = codegen::rt;

double ToDouble(ir::DType dtype, const unsigned char* p, int64_t i) {
  switch (dtype) {
    case ir::DType::kF32: return reinterpret_cast<const float*>(p)[i];
    case ir::DType::kF16: return rt::fusor_f16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
    case ir::DType::kBF16: return rt::fusor_bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
  }
  return 0;
}

}  // namespace

std::vector<const void*> Pointers(std::vector<HostTensor>& tensors) {
  std::vector<const void*> p;
  for (HostTensor& t : tensors) p.push_back(t.data());
  return p;
}

std::vector<double> StoreInDType(ir::DType dtype, const std::vector<double>& values, HostTensor& t) {
  const int bytes = ir::DTypeBytes(dtype);
  t.bytes.assign(values.size() * bytes, 0);
  std::vector<double> stored(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    float v = static_cast<float>(values[i]);
    if (dtype == ir::DType::kF32) {
      reinterpret_cast<float*>(t.data())[i] = v;
    } else {
      uint16_t h = dtype == ir::DType::kF16 ? rt::fusor_f32_to_f16(v) : rt::fusor_f32_to_bf16(v);
      reinterpret_cast<uint16_t*>(t.data())[i] = h;
    }
    stored[i] = ToDouble(dtype, t.bytes.data(), static_cast<int64_t>(i));
  }
  return stored;
}

void Poison(ir::DType dtype, int64_t n, HostTensor& t) {
  const int bytes = ir::DTypeBytes(dtype);
  t.bytes.assign(static_cast<size_t>(n) * bytes, 0);
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == ir::DType::kF32) {
      reinterpret_cast<float*>(t.data())[i] = std::nanf("");
    } else {
      reinterpret_cast<uint16_t*>(t.data())[i] = dtype == ir::DType::kF16 ? 0x7e00 : 0x7fc0;
    }
  }
}

double Tolerance(ir::DType dtype) {
  switch (dtype) {
    case ir::DType::kF32: return 1e-4;
    case ir::DType::kF16: return 2e-3;
    case ir::DType::kBF16: return 1e-2;
  }
  return 1e-4;
}

std::vector<double> RoundToDType(ir::DType dtype, const std::vector<double>& values) {
  HostTensor scratch;
  return StoreInDType(dtype, values, scratch);
}

namespace {

// Each ranged dim at `pick(dim)`; duplicates of earlier entries of `out` left out.
void AddSizes(const ir::Chain& chain, const std::function<int64_t(const ir::Dim&, size_t)>& pick,
              std::vector<std::vector<int64_t>>& out) {
  std::vector<int64_t> sizes;
  const std::vector<int> ranged = chain.RangedDims();
  for (size_t i = 0; i < ranged.size(); ++i) sizes.push_back(pick(chain.dims[ranged[i]], i));
  if (!sizes.empty() && std::find(out.begin(), out.end(), sizes) == out.end()) out.push_back(std::move(sizes));
}

int64_t GeometricMiddle(const ir::Dim& d) {
  return std::clamp<int64_t>(std::llround(std::sqrt(static_cast<double>(d.min) * static_cast<double>(d.extent))),
                             d.min, d.extent);
}

}  // namespace

std::vector<std::vector<int64_t>> ValidationSizes(const ir::Chain& chain) {
  std::vector<std::vector<int64_t>> out;
  AddSizes(chain, [](const ir::Dim& d, size_t) { return d.extent; }, out);
  AddSizes(chain, [](const ir::Dim& d, size_t) { return d.min; }, out);
  AddSizes(chain, [](const ir::Dim& d, size_t) { return std::min(d.extent, (d.min + 2 * d.extent) / 3 | 1); }, out);
  if (chain.RangedDims().size() >= 2) {
    AddSizes(chain, [](const ir::Dim& d, size_t i) { return i == 0 ? d.min : d.extent; }, out);
  }
  return out;
}

std::vector<std::vector<int64_t>> TimingSizes(const ir::Chain& chain) {
  std::vector<std::vector<int64_t>> out;
  AddSizes(chain, [](const ir::Dim& d, size_t) { return d.extent; }, out);
  AddSizes(chain, [](const ir::Dim& d, size_t) { return GeometricMiddle(d); }, out);
  return out;
}

std::vector<std::vector<double>> RandomInputs(const ir::Chain& chain, uint64_t seed) {
  // A long sum of unit-sized products grows like the square root of its
  // length, and a chain of them (LLaMA's FFN: 4096, then 11008) leaves the
  // f16 range. As initialized weights are, the last input that a long
  // (>= 1024) sum reduces over is scaled by 1 / sqrt(length).
  std::vector<double> scale(chain.tensors.size(), 1.0);
  for (const ir::Op& op : chain.ops) {
    if (op.kind != ir::OpKind::kSum) continue;
    double length = 1;
    for (int d : op.reduce) length *= static_cast<double>(chain.dims[d].extent);
    if (length < 1024) continue;
    int last = -1;
    ir::ForEachAccess(op.body, [&](const ir::Access& a) {
      if (chain.tensors[a.tensor].producer >= 0) return;
      for (const ir::AffineExpr& e : a.index) {
        for (int d : op.reduce) {
          if (e.DependsOn(d)) last = a.tensor;
        }
      }
    });
    if (last >= 0) scale[last] = std::min(scale[last], 1 / std::sqrt(length));
  }
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<std::vector<double>> inputs;
  for (int t : chain.inputs) {
    std::vector<double> values(chain.tensors[t].NumElements());
    for (double& v : values) v = dist(rng) * scale[t];
    inputs.push_back(std::move(values));
  }
  return inputs;
}

namespace {

constexpr char kReferenceMagic[] = "fusor-reference 1\n";

// The outputs in `path`, when it holds exactly `chain`'s.
std::optional<Outputs> ReadReference(const std::string& path, const ir::Chain& chain) {
  std::ifstream in(path, std::ios::binary);
  std::string magic(sizeof(kReferenceMagic) - 1, '\0');
  if (!in.read(magic.data(), static_cast<std::streamsize>(magic.size())) || magic != kReferenceMagic) {
    return std::nullopt;
  }
  Outputs out;
  for (int t : chain.outputs) {
    std::vector<double> values(static_cast<size_t>(chain.tensors[t].NumElements()));
    if (!in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(double)))) {
      return std::nullopt;
    }
    out.push_back(std::move(values));
  }
  if (in.peek() != std::char_traits<char>::eof()) return std::nullopt;
  return out;
}

}  // namespace

uint64_t TaskInputSeed(const std::string& task_id, int64_t set) {
  const std::string digest = Sha256Hex(absl::StrCat(task_id, "/", set % kInputSets));
  return std::stoull(digest.substr(0, 15), nullptr, 16);
}

absl::StatusOr<Outputs> CachedReference(const ir::Chain& chain, uint64_t seed,
                                        const std::vector<std::vector<double>>& rounded_inputs,
                                        const std::string& dir, int64_t max_bytes) {
  if (dir.empty()) return ir::EvaluateReference(chain, rounded_inputs);
  namespace fs = std::filesystem;
  const std::string path =
      absl::StrCat(dir, "/", Sha256Hex(absl::StrCat(ir::ChainToJson(chain), "\n", seed)).substr(0, 32), ".ref");
  std::error_code ec;
  if (std::optional<Outputs> kept = ReadReference(path, chain)) {
    fs::last_write_time(path, fs::file_time_type::clock::now(), ec);  // recently used
    return *std::move(kept);
  }
  ASSIGN_OR_RETURN(Outputs computed, ir::EvaluateReference(chain, rounded_inputs));
  // Written aside and renamed: a job reading it sees all of it or nothing.
  fs::create_directories(dir, ec);
  const std::string partial = absl::StrCat(path, ".", getpid(), ".part");
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out.write(kReferenceMagic, sizeof(kReferenceMagic) - 1);
    for (const std::vector<double>& values : computed) {
      out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(double)));
    }
    if (!out) {
      fs::remove(partial, ec);
      return computed;  // not kept; the result stands
    }
  }
  fs::rename(partial, path, ec);
  if (ec) fs::remove(partial, ec);
  EvictLeastRecentlyUsed(dir, max_bytes, path);
  return computed;
}

absl::StatusOr<Validation> ValidateRun(const RunFn& run, const ir::Chain& chain,
                                       const std::vector<std::vector<double>>& values, double tolerance,
                                       const ReferenceFn& reference) {
  if (values.size() != chain.inputs.size()) return absl::InvalidArgumentError("wrong number of inputs");
  std::vector<HostTensor> inputs(chain.inputs.size()), outputs(chain.outputs.size());
  std::vector<std::vector<double>> ref_inputs;
  for (size_t i = 0; i < chain.inputs.size(); ++i) {
    if (static_cast<int64_t>(values[i].size()) != chain.tensors[chain.inputs[i]].NumElements()) {
      return absl::InvalidArgumentError("wrong input size");
    }
    ref_inputs.push_back(StoreInDType(chain.dtype, values[i], inputs[i]));
  }
  for (size_t i = 0; i < chain.outputs.size(); ++i) {
    Poison(chain.dtype, chain.tensors[chain.outputs[i]].NumElements(), outputs[i]);
  }
  std::vector<const void*> in_ptrs = Pointers(inputs);
  std::vector<void*> out_ptrs;
  for (HostTensor& t : outputs) out_ptrs.push_back(t.data());
  int rc = run(in_ptrs.data(), out_ptrs.data());
  if (rc != 0) return absl::InternalError(absl::StrCat("kernel returned ", rc));

  ASSIGN_OR_RETURN(Outputs ref, reference ? reference(ref_inputs) : ir::EvaluateReference(chain, ref_inputs));
  if (ref.size() != chain.outputs.size()) return absl::InternalError("the reference has the wrong number of outputs");
  for (size_t o = 0; o < ref.size(); ++o) {
    if (static_cast<int64_t>(ref[o].size()) != chain.tensors[chain.outputs[o]].NumElements()) {
      return absl::InternalError("the reference has an output of the wrong size");
    }
  }
  const double rtol = tolerance > 0 ? tolerance : Tolerance(chain.dtype);
  Validation v;
  v.ok = true;
  for (size_t o = 0; o < chain.outputs.size(); ++o) {
    const std::vector<double>& r = ref[o];
    double sq = 0;
    for (double x : r) sq += x * x;
    const double rms = r.empty() ? 0 : std::sqrt(sq / static_cast<double>(r.size()));
    for (size_t i = 0; i < r.size(); ++i) {
      double got = ToDouble(chain.dtype, outputs[o].bytes.data(), static_cast<int64_t>(i));
      double err = std::fabs(got - r[i]);
      double scale = std::fabs(r[i]) + rms;
      double rel = scale > 0 ? err / scale : err;
      bool bad = !std::isfinite(got) || !(rel <= rtol);
      if (std::isfinite(err)) {
        v.max_abs_error = std::max(v.max_abs_error, err);
        v.max_rel_error = std::max(v.max_rel_error, rel);
      }
      if (bad && v.ok) {
        v.ok = false;
        v.detail = absl::StrCat("output '", chain.tensors[chain.outputs[o]].name, "' element ", i, ": got ", got,
                                ", expected ", r[i], " (relative error ", rel, " > tolerance ", rtol, ")");
      }
    }
  }
  return v;
}

}  // namespace fusor::worker
