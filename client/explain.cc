#include "client/explain.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/report.h"
#include "common/hw/devices.h"

namespace fusor::client {

std::string FormatExplain(const ir::Chain& chain, const hw::TargetDesc& target, const space::Space& space, int top) {
  const hw::ModelRates rates = hw::RatesFor(target);
  std::string out = absl::StrFormat(
      "chain      %s (%.3g GFLOP)\ntarget     %s (%s, %s, %d %s)\nmodel      W %.1f GB/s, P %.1f GFLOP/s, N_SM %d "
      "(%s)\n",
      chain.name, ir::ChainFlops(chain) / 1e9, hw::TargetFingerprint(target), target.arch, target.device_name,
      target.compute_units, target.backend == hw::Backend::kCuda ? "SMs" : "cores", rates.bandwidth_bytes_per_s / 1e9,
      rates.peak_flops / 1e9, rates.compute_units, hw::RateSourceName(rates.source));
  absl::StrAppendFormat(&out, "space      %d schedules enumerated, ranked in %.2f s (%.0f schedules/s)\n",
                        space.stats.enumerated, space.stats.seconds,
                        space.stats.seconds > 0 ? space.stats.stages[0].remaining / space.stats.seconds : 0);
  for (const space::SpaceStage& stage : space.stats.stages) {
    absl::StrAppendFormat(&out, "  %-38s %10d\n", stage.name, stage.remaining);
  }
  absl::StrAppendFormat(&out, "  %-38s %10d\n",
                        absl::StrFormat("+ %d other mappings on the best tilings", space.stats.mappings),
                        space.stats.mapped_schedules);
  if (space.stats.register_resident > 0) {
    absl::StrAppendFormat(&out, "  %-38s %10d\n", "+ register-resident kernels, ranked first",
                          space.stats.register_resident);
  }
  absl::StrAppendFormat(&out, "top %d by t_estm = (t_mem + t_comp) x alpha:\n", std::min<int>(top, space.ranked.size()));
  absl::StrAppendFormat(&out, "  %3s  %-44s %-10s %10s %10s %6s %10s  %s\n", "#", "schedule", "expr", "t_mem",
                        "t_comp", "alpha", "t_estm", "mapping");
  for (int i = 0; i < top && i < static_cast<int>(space.ranked.size()); ++i) {
    const space::RankedSchedule& r = space.ranked[i];
    space::Schedule loops_only = r.schedule;  // the mappings go in the last column
    loops_only.maps.assign(chain.ops.size(), {});
    const std::string text = space::ScheduleToText(loops_only, chain);
    absl::StrAppendFormat(&out, "  %3d  %-44s %-10s %10s %10s %6.2f %10s  %s\n", i + 1, text,
                          space::TilingExpression(r.schedule, chain), FormatSeconds(r.prediction.t_mem_s),
                          FormatSeconds(r.prediction.t_comp_s), r.prediction.alpha,
                          FormatSeconds(r.prediction.t_estm_s), r.mappings);
  }
  return out;
}

}  // namespace fusor::client
