// Built-in device descriptions, for targets that no worker has calibrated
// (fusor explain --target h100) and for W and P a worker did not measure.
// Figures are datasheet values (see REFERENCES.md); a calibrated worker's
// measurements always take precedence.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/hw/target.h"

namespace fusor::hw {

// "v100", "a100", "rtx3080", "rtx4090", "l4", "h100", "h200" (any case).
std::optional<TargetDesc> LookupDevice(absl::string_view name);
std::vector<std::string> DeviceNames();

// Where a target's W and P come from.
enum class RateSource { kCalibrated, kDeviceTable, kEstimate };
const char* RateSourceName(RateSource source);

struct ModelRates {
  double bandwidth_bytes_per_s = 0;  // W
  double peak_flops = 0;             // P
  int compute_units = 1;             // N_SM
  RateSource source = RateSource::kEstimate;
};

// W, P and N_SM for the model: the target's calibrated values when it has
// them, else the device table's entry for its device name, else an
// estimate from its cores and vector width (CPU) or a generic GPU.
ModelRates RatesFor(const TargetDesc& target);

}  // namespace fusor::hw
