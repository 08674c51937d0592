#include "client/mappings.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/mapping/mapping.h"

namespace fusor::client {

std::string FormatMappings(const ir::Chain& chain, const std::vector<const hw::Intrinsic*>& intrinsics) {
  std::string out;
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    const std::string name = chain.tensors[chain.ops[o].output].name;
    auto sw = mapping::ViewOp(chain, static_cast<int>(o));
    if (!sw.ok()) {
      if (chain.ops[o].kind == ir::OpKind::kSum) {
        absl::StrAppendFormat(&out, "%s: not mappable (%s); scalar code\n\n", name, sw.status().message());
      }
      continue;
    }
    for (const hw::Intrinsic* x : intrinsics) {
      mapping::MappingCounts c = mapping::CountMappings(chain, *sw, *x);
      absl::StrAppendFormat(&out,
                            "%s onto %s: %d kind-compatible matchings, %d basic, %d mappings, %d valid, %d strict\n",
                            name, x->name, c.kind_compatible, c.basic, c.mappings, c.valid, c.strict);
      for (const mapping::Mapping& m : mapping::KindCompatibleMatchings(*sw, *x)) {
        mapping::Verdict v = mapping::Validate(chain, *sw, m);
        absl::StrAppendFormat(&out, "  matching %-44s %s\n", mapping::MappingToText(m, chain),
                              v.valid ? "basic" : "rejected: " + v.reason);
      }
      for (const mapping::Mapping& m : mapping::GenerateMappings(chain, *sw, *x).mappings) {
        mapping::Verdict v = mapping::Validate(chain, *sw, m);
        std::string verdict = v.valid ? absl::StrFormat("valid%s, padding %.2fx", v.strict ? ", strict" : "", v.padding)
                                      : "invalid: " + v.reason;
        absl::StrAppendFormat(&out, "  mapping  %-44s %s\n", mapping::MappingToText(m, chain), verdict);
      }
      out += "\n";
    }
  }
  return out;
}

std::string MappingSummaryHeader() {
  return "| operator | op | kind-compatible matchings | basic matchings | mappings | valid | strict-feasible |\n"
         "|---|---|---|---|---|---|---|\n";
}

std::string MappingSummaryRows(const std::string& name, const ir::Chain& chain, const hw::Intrinsic& intrinsic) {
  std::string out;
  for (size_t o = 0; o < chain.ops.size(); ++o) {
    auto sw = mapping::ViewOp(chain, static_cast<int>(o));
    if (!sw.ok()) continue;
    mapping::MappingCounts c = mapping::CountMappings(chain, *sw, intrinsic);
    absl::StrAppendFormat(&out, "| %s | %s | %d | %d | %d | %d | %d |\n", name, chain.tensors[chain.ops[o].output].name,
                          c.kind_compatible, c.basic, c.mappings, c.valid, c.strict);
  }
  return out;
}

}  // namespace fusor::client
