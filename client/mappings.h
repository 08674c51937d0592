// `fusor mappings`: every mapping of a chain's sum ops onto intrinsics,
// with each one's validation result and, for invalid ones, why.
#pragma once

#include <string>
#include <vector>

#include "common/hw/intrinsic.h"
#include "common/ir/chain.h"

namespace fusor::client {

// Per sum op and intrinsic: the counts, every kind-compatible matching
// (valid or why not), and every mapping (valid, strict, padding, or why not).
std::string FormatMappings(const ir::Chain& chain, const std::vector<const hw::Intrinsic*>& intrinsics);

// Markdown rows "| operator | op | kind-compatible | basic | mappings | valid | strict |".
std::string MappingSummaryHeader();
std::string MappingSummaryRows(const std::string& name, const ir::Chain& chain, const hw::Intrinsic& intrinsic);

}  // namespace fusor::client
