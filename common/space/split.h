// Answers that are not one fused kernel: the chain unfused, or split in two.
//
// A CPU task's answer may run the chain unfused, its GEMMs through a vendor
// library ("unfused onednn"), or split at an intermediate tensor into two
// parts run one after the other, each fused or unfused:
//   split after G: m=64 / - / H(c=256) | unfused onednn
// The head is the producer of the named tensor and every op it depends on;
// the tail is the rest of the chain. Each part is a chain of its own
// (SplitChain): it keeps the names of the dims and tensors it uses, takes
// what the other part produces as inputs, and hands on, as outputs, what
// the other part reads. A fused part's schedule is a schedule text of that
// part's chain, so texts use the names of the chain they belong to, like a
// fused schedule's.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/hw/target.h"
#include "common/ir/chain.h"
#include "common/space/schedule.h"

namespace fusor::space {

// "unfused " and the library the GEMMs go through ("onednn", "openblas").
inline constexpr char kUnfusedPrefix[] = "unfused ";
// The library of an unfused text; empty for any other text.
std::string UnfusedVendor(absl::string_view text);

inline constexpr char kSplitPrefix[] = "split after ";
bool IsSplitText(absl::string_view text);

// The two parts of `chain` split after tensor `boundary` (an op's output
// that the rest of the chain reads): INVALID_ARGUMENT when a part would be
// empty.
struct ChainParts {
  std::array<ir::Chain, 2> parts;  // head, tail
  // The tensors the head writes and the tail reads that are not the
  // chain's outputs: the answer keeps them in buffers of its own.
  std::vector<std::string> handed_on;
};
absl::StatusOr<ChainParts> SplitChain(const ir::Chain& chain, int boundary);

// The intermediates a split may follow: those whose head and tail would
// each hold at least one sum (a part of elementwise ops alone would only
// move a GEMM's epilogue). None for a chain with ranged dims: it runs fused.
std::vector<int> SplitPoints(const ir::Chain& chain);

// A fused schedule of `chain` restricted to `part` (one of its
// SplitChain parts): the loops over the part's dims with their tiles, and
// the part's ops' own loops and mappings (a part of one op has no stream
// loop: its dims become the op's innermost own loops where it sums over
// them, block dims otherwise). INVALID_ARGUMENT for a regrouped schedule.
absl::StatusOr<Schedule> ProjectSchedule(const Schedule& schedule, const ir::Chain& chain, const ir::Chain& part);

struct SplitSchedule {
  int boundary = -1;                 // tensor id in the chain
  ChainParts chains;
  std::array<std::string, 2> texts;  // per part: a fused schedule text of its chain, or an unfused text
};
absl::StatusOr<SplitSchedule> ParseSplit(absl::string_view text, const ir::Chain& chain);
// The words of a split's text, without a chain to check them against:
// "split after TENSOR: HEAD | TAIL".
struct SplitWords {
  std::string tensor;
  std::array<std::string, 2> texts;
};
absl::StatusOr<SplitWords> ReadSplitWords(absl::string_view text);
std::string SplitToText(const ir::Chain& chain, int boundary, const std::array<std::string, 2>& texts);
// How each part maps onto the target, "HEAD | TAIL": a fused part's
// DescribeMappings, an unfused part's text.
std::string SplitMappings(const SplitSchedule& split, const hw::TargetDesc& target);

}  // namespace fusor::space
