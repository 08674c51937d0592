#include "common/model/cost_model.h"

#include <algorithm>

namespace fusor::model {

Prediction Predict(const space::LoopNest& nest, const hw::TargetDesc& target) {
  const double w = target.bandwidth_bytes_per_s > 0 ? target.bandwidth_bytes_per_s : 10e9;
  const double p = target.peak_flops > 0 ? target.peak_flops : 50e9;
  Prediction pred;
  for (const space::Statement& s : nest.statements) {
    if (s.kind == space::StmtKind::kCompute) {
      pred.t_comp_s += s.flops * s.executions / p;
    } else {
      pred.t_mem_s += s.bytes * s.executions / w;
    }
  }
  const double blocks = static_cast<double>(std::max<int64_t>(nest.num_blocks, 1));
  pred.alpha = (blocks + std::max(target.compute_units, 1)) / blocks;
  pred.t_estm_s = (pred.t_mem_s + pred.t_comp_s) * pred.alpha;
  return pred;
}

}  // namespace fusor::model
