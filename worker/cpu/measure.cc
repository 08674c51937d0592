#include "worker/cpu/measure.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "common/util/quiet.h"
#include "common/util/timing.h"

namespace fusor::worker {
namespace {

// The least warm-up of each slice of kernels timed together, in seconds.
constexpr double kSliceWarmupS = 1e-3;
// Between a serving process's requests: how long a slice waits for them to
// end, and how often one that a request interrupted is taken again.
constexpr double kQuietWaitS = 2.0;
constexpr int kQuietRetries = 3;

void FillRandom(ir::DType dtype, int64_t n, std::mt19937_64& rng, HostTensor& t) {
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> values(n);
  for (double& v : values) v = dist(rng);
  StoreInDType(dtype, values, t);
}

}  // namespace

absl::StatusOr<LoadedKernel> LoadedKernel::Open(const std::string& so_path, const std::string& entry) {
  // RTLD_NODELETE: the kernel's OpenMP runtime keeps idle threads alive;
  // unloading it under them would crash the process.
  void* handle = dlopen(so_path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) return absl::FailedPreconditionError(absl::StrCat("dlopen: ", dlerror()));
  void* sym = dlsym(handle, entry.c_str());
  if (sym == nullptr) {
    dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat("kernel has no symbol '", entry, "'"));
  }
  LoadedKernel kernel(handle, reinterpret_cast<EntryFn>(sym));
  kernel.entry_dims_ = reinterpret_cast<DimsEntryFn>(dlsym(handle, "fusor_run_dims"));
  PrepareFns fns;
  fns.prepare = reinterpret_cast<decltype(fns.prepare)>(dlsym(handle, "fusor_prepare"));
  fns.run = reinterpret_cast<decltype(fns.run)>(dlsym(handle, "fusor_run_prepared"));
  fns.release = reinterpret_cast<decltype(fns.release)>(dlsym(handle, "fusor_release"));
  fns.run_dims = reinterpret_cast<decltype(fns.run_dims)>(dlsym(handle, "fusor_run_prepared_dims"));
  if (fns.prepare != nullptr && fns.run != nullptr && fns.release != nullptr) kernel.prepare_ = fns;
  return kernel;
}

LoadedKernel::LoadedKernel(LoadedKernel&& other) noexcept
    : handle_(other.handle_), entry_(other.entry_), entry_dims_(other.entry_dims_), prepare_(other.prepare_) {
  other.handle_ = nullptr;
}

KernelCalls::~KernelCalls() {
  for (auto& [pointers, state] : states_) kernel_.prepare()->release(state);
}

// The prepared state of this input set: found, or made now (null when
// fusor_prepare ran out of memory).
void* KernelCalls::StateFor(const void* const* inputs) {
  for (auto& [pointers, state] : states_) {
    if (std::equal(pointers.begin(), pointers.end(), inputs)) return state;
  }
  const auto t0 = std::chrono::steady_clock::now();
  void* state = kernel_.prepare()->prepare(inputs);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (state == nullptr) return nullptr;
  if (states_.empty()) prepare_s_ = seconds;
  states_.emplace_back(std::vector<const void*>(inputs, inputs + num_inputs_), state);
  return state;
}

int KernelCalls::Prepare(const void* const* inputs) { return !prepared_ || StateFor(inputs) != nullptr ? 0 : 1; }

int KernelCalls::Run(const void* const* inputs, void* const* outputs) {
  // Sizes for a kernel that takes none: a kernel of another chain (3).
  if (!dims_.empty() && kernel_.entry_dims() == nullptr) return 3;
  if (!prepared_) {
    return dims_.empty() ? kernel_.entry()(inputs, outputs, threads_)
                         : kernel_.entry_dims()(dims_.data(), inputs, outputs, threads_);
  }
  // One lookup on the timed path: every set is prepared before timing.
  void* state = StateFor(inputs);
  if (state == nullptr) return 1;
  if (dims_.empty()) return kernel_.prepare()->run(state, inputs, outputs, threads_);
  return kernel_.prepare()->run_dims == nullptr ? 3
                                                : kernel_.prepare()->run_dims(state, dims_.data(), inputs, outputs, threads_);
}

void* LoadedKernel::Symbol(const std::string& name) const { return dlsym(handle_, name.c_str()); }

LoadedKernel::~LoadedKernel() {
  if (handle_ != nullptr) dlclose(handle_);
}

absl::StatusOr<Validation> ValidateKernel(const LoadedKernel& kernel, const ir::Chain& chain,
                                          uint64_t seed, int num_threads, double rtol) {
  return ValidateKernelOn(kernel, chain, RandomInputs(chain, seed), num_threads, rtol);
}

absl::StatusOr<Validation> ValidateKernelOn(const LoadedKernel& kernel, const ir::Chain& chain,
                                            const std::vector<std::vector<double>>& values, int num_threads,
                                            double tolerance, const ReferenceFn& reference,
                                            const std::vector<long>& dims) {
  absl::StatusOr<Validation> v;
  for (bool prepared : {false, true}) {
    if (prepared && !kernel.prepare()) break;
    KernelCalls calls(kernel, chain.inputs.size(), num_threads, prepared, dims);
    v = ValidateRun([&](const void* const* in, void* const* out) { return calls.Run(in, out); }, chain, values,
                    tolerance, reference);
    if (!v.ok() || !v->ok) break;
  }
  return v;
}

absl::StatusOr<std::vector<TrustedTiming>> TimeKernelsTogether(const std::vector<const LoadedKernel*>& kernels,
                                                        const ir::Chain& chain, const TimingOptions& options,
                                                        const std::vector<std::vector<int>>& groups,
                                                        std::vector<double>* prepare_s,
                                                        const std::vector<std::vector<long>>& dims) {
  std::mt19937_64 rng(options.seed);
  int64_t input_bytes = 0;
  for (int t : chain.inputs) input_bytes += chain.tensors[t].NumElements() * ir::DTypeBytes(chain.dtype);
  int sets = 1;
  if (input_bytes > 0 && options.rotate_bytes > input_bytes) {
    sets = static_cast<int>(std::min<int64_t>(8, (options.rotate_bytes + input_bytes - 1) / input_bytes));
  }
  std::vector<std::vector<HostTensor>> inputs(sets, std::vector<HostTensor>(chain.inputs.size()));
  for (size_t i = 0; i < chain.inputs.size(); ++i) {
    FillRandom(chain.dtype, chain.tensors[chain.inputs[i]].NumElements(), rng, inputs[0][i]);
  }
  // The other sets are copies at other addresses: the rotation is there so
  // that each run finds its inputs out of the caches, which other values
  // would not add to. Drawing every set took a job 0.4 s on the FFN block
  // (8 sets of 19 MB).
  for (int s = 1; s < sets; ++s) inputs[s] = inputs[0];
  std::vector<HostTensor> outputs(chain.outputs.size());
  for (size_t i = 0; i < chain.outputs.size(); ++i) {
    Poison(chain.dtype, chain.tensors[chain.outputs[i]].NumElements(), outputs[i]);
  }
  std::vector<void*> out_ptrs;
  for (HostTensor& t : outputs) out_ptrs.push_back(t.data());
  std::vector<std::vector<const void*>> in_ptrs;
  for (auto& set : inputs) in_ptrs.push_back(Pointers(set));

  using Clock = std::chrono::steady_clock;
  int run = 0;
  std::vector<std::unique_ptr<KernelCalls>> calls;
  for (size_t k = 0; k < kernels.size(); ++k) {
    calls.push_back(std::make_unique<KernelCalls>(*kernels[k], chain.inputs.size(), options.num_threads, true,
                                                  k < dims.size() ? dims[k] : std::vector<long>{}));
    // Every input set prepared before any timing: a model prepares its
    // weights once, not in the forward pass it is timed on.
    for (const auto& set : in_ptrs) {
      if (calls.back()->Prepare(set.data()) != 0) return absl::ResourceExhaustedError("fusor_prepare ran out of memory");
    }
  }
  auto call = [&](size_t k) -> absl::Status {
    int rc = calls[k]->Run(in_ptrs[run % sets].data(), out_ptrs.data());
    ++run;
    if (rc != 0) return absl::InternalError(absl::StrCat("kernel returned ", rc));
    return absl::OkStatus();
  };
  // Between a serving process's requests, where there is one: a slice
  // that saw one start is taken again.
  std::optional<QuietGate> gate;
  if (!options.quiet_file.empty()) {
    absl::StatusOr<QuietGate> opened = QuietGate::Open(options.quiet_file);
    if (opened.ok()) gate.emplace(*std::move(opened));
  }
  // One sample set per kernel: warm-up, then samples to the time budget;
  // with several kernels (or between requests), in slices of the budget,
  // taking turns.
  const bool together = kernels.size() > 1;
  const int slices = together || gate ? 8 : 1;
  const int min_repeats = std::max(options.min_repeats, kMinSamples);
  const int slice_min = (min_repeats + slices - 1) / slices;
  const int slice_max = std::max(slice_min, std::max(options.max_repeats, min_repeats) / slices);
  auto take_sets = [&]() -> absl::StatusOr<std::vector<std::vector<double>>> {
    std::vector<std::vector<double>> samples(kernels.size());
    for (int slice = 0; slice < slices; ++slice) {
      for (size_t k = 0; k < kernels.size(); ++k) {
        for (int attempt = 0;; ++attempt) {
          // The last kernel's threads may still spin (OpenBLAS's own pool
          // where it is not the OpenMP build): let them sleep first.
          if (together) std::this_thread::sleep_for(std::chrono::milliseconds(10));
          if (gate) gate->WaitQuiet(kQuietWaitS);
          const uint64_t requests = gate ? gate->Started() : 0;
          // After the pause the threads are asleep and the caches cold: warm
          // up for a few calls and at least a millisecond, or a kernel of
          // microseconds measures its own wake-up (its medians then came out
          // 40-60% above the same kernel timed alone).
          const auto warm_start = Clock::now();
          for (int i = 0; i < (slice == 0 ? options.warmup : std::min(options.warmup, 1)) ||
                          ((together || gate) &&
                           std::chrono::duration<double>(Clock::now() - warm_start).count() < kSliceWarmupS);
               ++i) {
            RETURN_IF_ERROR(call(k));
          }
          std::vector<double> taken;
          const auto start = Clock::now();
          for (int n = 0; n < slice_max; ++n) {
            const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
            if (n >= slice_min && elapsed >= options.time_budget_s / slices) break;
            const auto t0 = Clock::now();
            RETURN_IF_ERROR(call(k));
            taken.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
          }
          // A request that started meanwhile is in these samples: taken again
          // (a few times, then kept: the spread tells).
          if (gate && (gate->Started() != requests || gate->Running() != 0) && attempt < kQuietRetries) continue;
          samples[k].insert(samples[k].end(), taken.begin(), taken.end());
          break;
        }
      }
    }
    return samples;
  };
  auto timed = MeasureTrustedTogether(take_sets, groups, kSampleSets, options.max_spread);
  if (prepare_s != nullptr) {
    prepare_s->clear();
    for (const auto& c : calls) prepare_s->push_back(c->prepare_s());
  }
  return timed;
}

}  // namespace fusor::worker
