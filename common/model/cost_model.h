// MCFuser's analytical cost model:
//   t_estm = (t_mem + t_comp) * alpha
//   t_mem  = sum over loads/stores S of TS(S) * prod_{l in LP_set(S)} trips(l) / W
//   t_comp = sum over computes S of Fp(S) * prod_{l in LP_set(S)} trips(l) / P
//   alpha  = (N_block + N_SM) / N_block
// TS is a statement's tile in bytes, Fp its FLOPs per execution (padded
// tiles count in full, so padding costs time), W and P the target's
// calibrated bandwidth and peak rate; a compute statement runs at its
// intrinsic's share of P (scalar code at the scalar share). alpha charges
// the last partial wave of blocks over the N_SM compute units (cores on a
// CPU).
#pragma once

#include "common/hw/target.h"
#include "common/space/loop_nest.h"

namespace fusor::model {

struct Prediction {
  double t_mem_s = 0;
  double t_comp_s = 0;
  double alpha = 1;
  double t_estm_s = 0;
};

// W, P and N_SM from hw::RatesFor(target): calibrated, device table or
// estimate. `chain` is the chain the nest was built for (as written; a
// regrouped nest carries its own).
Prediction Predict(const space::LoopNest& nest, const hw::TargetDesc& target, const ir::Chain& chain);

// The chain unfused, as its baseline runs it (each op over whole tensors,
// GEMMs through a vendor library at the peak rate P): per op, every tensor
// it reads and writes moved once at W, and its FLOPs at P; alpha 1.
Prediction PredictUnfused(const ir::Chain& chain, const hw::TargetDesc& target);

// The least time a run of the chain can take on the target, by the model's
// own terms: its FLOPs (those of its cheapest regrouping; the keys a causal
// softmax keeps) at a peak rate no such device exceeds, or the bytes of its
// inputs and outputs that cannot stay in the caches between runs (beyond
// the L2s and L3 of a CPU, the L2 of a GPU) at a bandwidth none exceeds,
// whichever is longer. The bounds come from the target's identity (cores,
// lanes, the device table), never from a worker's calibration, which a busy
// machine (or a forger) can get wrong: a CPU core at 6.5 GHz with two FMA
// pipes (16 times that for 16-bit chains, which a library may run on AMX),
// 50 GB/s per core; twice a GPU's table P and W, or 8192 FLOPs per SM and
// cycle at 3 GHz and 10 TB/s for one not in the table. A measurement below
// it is not physical.
double PhysicalFloorS(const ir::Chain& chain, const hw::TargetDesc& target);

// What ranks a space: a nest's predicted time on a target. The search
// strategy receives one (search/search_strategy.h), as TVM's SearchStrategy
// receives its CostModel; the analytical model above is the first.
class CostModel {
 public:
  virtual ~CostModel() = default;
  virtual const char* name() const = 0;
  virtual Prediction Predict(const space::LoopNest& nest, const hw::TargetDesc& target,
                             const ir::Chain& chain) const = 0;
};

// The analytical model (Predict above), named "analytical".
const CostModel& AnalyticalModel();

}  // namespace fusor::model
