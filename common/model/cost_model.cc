#include "common/model/cost_model.h"

#include <algorithm>

#include "common/hw/devices.h"

namespace fusor::model {

Prediction Predict(const space::LoopNest& nest, const hw::TargetDesc& target) {
  const hw::ModelRates rates = hw::RatesFor(target);
  const double w = rates.bandwidth_bytes_per_s;
  const double p = rates.peak_flops;
  Prediction pred;
  for (const space::Statement& s : nest.statements) {
    if (s.kind == space::StmtKind::kCompute) {
      pred.t_comp_s += s.flops * s.executions / (p * s.rate);
    } else {
      pred.t_mem_s += s.bytes * s.executions / w;
    }
  }
  const double blocks = static_cast<double>(std::max<int64_t>(nest.num_blocks, 1));
  pred.alpha = (blocks + rates.compute_units) / blocks;
  pred.t_estm_s = (pred.t_mem_s + pred.t_comp_s) * pred.alpha;
  return pred;
}

}  // namespace fusor::model
