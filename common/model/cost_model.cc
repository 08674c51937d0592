#include "common/model/cost_model.h"

#include <algorithm>
#include <cmath>

#include "common/codegen/cpu/cpu_codegen.h"
#include "common/hw/devices.h"
#include "common/ir/regroup.h"

namespace fusor::model {
namespace {

bool Contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// The L2's read rate over the memory's on data-center GPUs, a lead: about
// 5.5 TB/s of L2 against 2 TB/s of HBM measured on an H100 PCIe
// (chipsandcheese.com, 2023), taken conservatively.
constexpr double kL2Rate = 2.0;

// CPU: bytes an accumulator moves through the caches beyond its first
// partial sum. A GEMM-shaped op whose reduction is split (own loops over
// reduced dims, reduced dims outside the intrinsic, or the stream loop it
// accumulates across) reads and writes its tile once more per partial
// sum; the split stream loop's parts are separate blocks, not revisits.
double AccumulatorBytes(const space::LoopNest& nest, const ir::Chain& chain) {
  double bytes = 0;
  for (const space::OpNest& on : nest.ops) {
    if (!on.gemm.ok) continue;
    const ir::Op& op = chain.ops[on.op];
    double partials = 1;
    for (int d : op.reduce) {
      if (Contains(on.loops, d)) partials *= static_cast<double>(nest.trips[d]);
      if (Contains(on.gemm.outer_reduce, d)) partials *= static_cast<double>(chain.dims[d].extent);
    }
    if (on.accumulates) {
      const int sd = nest.stream_dim;
      partials *= std::ceil(static_cast<double>(nest.trips[sd]) / nest.split);
    }
    if (partials <= 1) continue;
    double elements = 1;
    for (int d : op.index) elements *= static_cast<double>(chain.dims[d].extent);
    bytes += 2 * 4 * elements * (partials - 1);
  }
  return bytes;
}

}  // namespace

Prediction PredictUnfused(const ir::Chain& chain, const hw::TargetDesc& target) {
  const hw::ModelRates rates = hw::RatesFor(target);
  Prediction pred;
  for (const ir::Op& op : chain.ops) {
    double elements = static_cast<double>(chain.tensors[op.output].NumElements());
    for (int t : ir::TensorsRead(op)) elements += static_cast<double>(chain.tensors[t].NumElements());
    pred.t_mem_s += elements * ir::DTypeBytes(chain.dtype) / rates.bandwidth_bytes_per_s;
  }
  pred.t_comp_s = ir::ChainFlops(chain, /*dense=*/true) / rates.peak_flops;  // the unfused ops mask, never skip
  pred.t_estm_s = pred.t_mem_s + pred.t_comp_s;
  return pred;
}

namespace {

// The fewest FLOPs a schedule of `chain` may do: the chain's own, or a
// regrouping's (E = A*(B*D) may contract a smaller pair first).
double FewestFlops(const ir::Chain& chain) {
  double flops = ir::ChainFlops(chain);
  for (const ir::Regroup& r : ir::Regroupings(chain)) {
    if (absl::StatusOr<ir::Chain> c = ir::ApplyRegroup(chain, r); c.ok()) flops = std::min(flops, ir::ChainFlops(*c));
  }
  return flops;
}

}  // namespace

double PhysicalFloorS(const ir::Chain& chain, const hw::TargetDesc& target) {
  hw::TargetDesc identity = target;
  identity.bandwidth_bytes_per_s = identity.peak_flops = 0;
  hw::ModelRates rates = hw::RatesFor(identity);  // the device table's, else an estimate
  const double units = rates.compute_units;
  if (target.backend == hw::Backend::kCpu) {
    const bool narrow = chain.dtype == ir::DType::kF16 || chain.dtype == ir::DType::kBF16;  // a library may use AMX
    rates.peak_flops = units * std::max(target.vector_lanes_f32, 1) * 2 * 2 * 6.5e9 * (narrow ? 16 : 1);
    rates.bandwidth_bytes_per_s = units * 50e9;
  } else if (rates.source == hw::RateSource::kDeviceTable) {
    // The table is matched by name: a variant of a device (an NVL or a
    // Grace-Hopper part) may be faster than its entry.
    rates.peak_flops *= 2;
    rates.bandwidth_bytes_per_s *= 2;
  } else {
    rates.peak_flops = std::max(rates.peak_flops, units * 8192 * 3e9);
    rates.bandwidth_bytes_per_s = std::max(rates.bandwidth_bytes_per_s, 10e12);
  }
  double bytes = 0;
  for (const std::vector<int>* ids : {&chain.inputs, &chain.outputs}) {
    for (int t : *ids) bytes += static_cast<double>(chain.tensors[t].NumElements()) * ir::DTypeBytes(chain.dtype);
  }
  const double caches = target.backend == hw::Backend::kCpu
                            ? static_cast<double>(target.l2_bytes) * units + static_cast<double>(target.l3_bytes)
                            : static_cast<double>(target.l2_bytes);
  return std::max(FewestFlops(chain) / rates.peak_flops,
                  std::max(0.0, bytes - caches) / rates.bandwidth_bytes_per_s);
}

Prediction Predict(const space::LoopNest& nest, const hw::TargetDesc& target, const ir::Chain& written) {
  const ir::Chain& chain = space::NestChain(written, nest);
  const hw::ModelRates rates = hw::RatesFor(target);
  const double w = rates.bandwidth_bytes_per_s;
  const double p = rates.peak_flops;
  // GPU: blocks that read the same tiles of a chain input find them in the
  // L2 after the first read when the inputs fit in half of it; those
  // re-reads are charged at kL2Rate times the memory bandwidth, and so are
  // a split loop's partial sums, read back in the launch that wrote them,
  // when they fit.
  const bool gpu = target.backend != hw::Backend::kCpu;
  double input_bytes = 0;
  for (int t : chain.inputs) input_bytes += static_cast<double>(chain.tensors[t].NumElements()) * ir::DTypeBytes(chain.dtype);
  const bool rereads_in_l2 = gpu && target.l2_bytes > 0 && input_bytes <= 0.5 * static_cast<double>(target.l2_bytes);
  Prediction pred;
  for (const space::Statement& s : nest.statements) {
    if (s.kind == space::StmtKind::kCompute) {
      pred.t_comp_s += s.flops * s.executions / (p * s.rate);
      continue;
    }
    const double bytes = s.bytes * s.executions;
    const bool input = s.tensor >= 0 && chain.tensors[s.tensor].role == ir::TensorRole::kInput;
    if (gpu && s.partials && target.l2_bytes > 0 && bytes <= 0.5 * static_cast<double>(target.l2_bytes)) {
      pred.t_mem_s += bytes / (kL2Rate * w);
    } else if (rereads_in_l2 && s.kind == space::StmtKind::kLoad && input) {
      const double once = std::min(bytes, static_cast<double>(chain.tensors[s.tensor].NumElements()) *
                                              ir::DTypeBytes(chain.dtype));
      pred.t_mem_s += once / w + (bytes - once) / (kL2Rate * w);
    } else {
      pred.t_mem_s += bytes / w;
    }
  }
  const double blocks = static_cast<double>(std::max<int64_t>(nest.num_blocks, 1));
  const double units = std::max(rates.compute_units, 1);
  if (target.backend == hw::Backend::kCpu) {
    // A core's caches move about half a byte per peak FLOP: the partial
    // sums, and the packs, copies and passes the kernel's emitter plans.
    pred.t_mem_s += (AccumulatorBytes(nest, chain) + codegen::CpuStagingBytes(written, nest)) / (0.5 * p);
    // Blocks are handed to the cores as they free up: the last wave runs
    // only as many cores as it has blocks.
    pred.alpha = std::ceil(blocks / units) * units / blocks;
  } else {
    pred.alpha = (blocks + units) / blocks;
  }
  pred.t_estm_s = (pred.t_mem_s + pred.t_comp_s) * pred.alpha;
  return pred;
}

const CostModel& AnalyticalModel() {
  class Analytical final : public CostModel {
   public:
    const char* name() const override { return "analytical"; }
    Prediction Predict(const space::LoopNest& nest, const hw::TargetDesc& target,
                       const ir::Chain& chain) const override {
      return model::Predict(nest, target, chain);
    }
  };
  static const Analytical analytical;
  return analytical;
}

}  // namespace fusor::model
