// Serving chains whose sizes change (scheduler_task.h): a request's varying
// dims widened to their ranges, records of the same chain at other sizes
// (a range that covers the request; the nearest, whose schedule is carried
// over), and why a request has no record of its own.
#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/ir/parse.h"
#include "common/ir/ranges.h"
#include "common/space/schedule.h"
#include "common/space/space.h"
#include "common/space/split.h"
#include "common/util/status_macros.h"
#include "proto/wire/convert.h"
#include "server/scheduler_task.h"

namespace fusor::server {
namespace {

// A best record of the request's family, its canonical chain read back.
struct Member {
  db::FamilyBestRow row;
  ir::Chain chain;  // canonical
  ir::CanonicalForm family;
};

// The records of `rows` this fusor reads, of the family `family_key` (any,
// when empty).
std::vector<Member> MembersOf(const std::vector<db::FamilyBestRow>& rows, const std::string& family_key = "") {
  std::vector<Member> members;
  for (const db::FamilyBestRow& row : rows) {
    absl::StatusOr<ir::Chain> chain = ir::ParseChainJson(row.workload.chain_json);
    if (!chain.ok()) continue;  // a record this fusor cannot read is no one's nearest
    Member m{row, *chain, ir::CanonicalFamily(*chain)};
    if (!family_key.empty() && m.family.key != family_key) continue;
    members.push_back(std::move(m));
  }
  return members;
}

// The TargetDesc fields a fingerprint is made of, by name.
std::vector<std::pair<std::string, std::string>> TargetFields(const hw::TargetDesc& t) {
  return {{"backend", t.backend == hw::Backend::kCpu ? "cpu" : "cuda"},
          {"arch", t.arch},
          {"device", t.device_name},
          {"compute units", absl::StrCat(t.compute_units)},
          {"f32 lanes", absl::StrCat(t.vector_lanes_f32)},
          {"isa", absl::StrJoin(t.isa_features, ",")},
          {"l1d bytes", absl::StrCat(t.l1d_bytes)},
          {"l2 bytes", absl::StrCat(t.l2_bytes)},
          {"l3 bytes", absl::StrCat(t.l3_bytes)},
          {"shared memory per block", absl::StrCat(t.shared_mem_per_block)},
          {"toolchain", t.compiler}};
}

std::vector<std::string> Lines(const std::string& text) { return absl::StrSplit(text, '\n', absl::SkipEmpty()); }

}  // namespace

std::string AnswerKindName(AnswerKind kind) {
  switch (kind) {
    case AnswerKind::kTuned: return "tuned";
    case AnswerKind::kCovered: return "covered";
    case AnswerKind::kTransferred: return "transferred";
  }
  return "tuned";
}

absl::Status Scheduler::FillFamilies() {
  ASSIGN_OR_RETURN(std::vector<db::WorkloadRow> rows, db_->WorkloadsWithoutFamily());
  for (const db::WorkloadRow& w : rows) {
    absl::StatusOr<ir::Chain> chain = ir::ParseChainJson(w.chain_json);
    if (!chain.ok()) continue;
    RETURN_IF_ERROR(db_->SetWorkloadFamily(w.key, ir::CanonicalFamily(*chain).key));
  }
  if (!rows.empty()) Log()->info("filled the family of {} workloads written by older fusor", rows.size());
  return absl::OkStatus();
}

absl::StatusOr<TuneResult> Scheduler::Lookup(const PreparedRequest& request,
                                             std::shared_ptr<const PreparedRequest>* served) {
  absl::StatusOr<TuneResult> own = ResultFromBest(request.canonical.key, request.target_fp, true);
  if (own.ok()) {
    if (served != nullptr) *served = std::make_shared<const PreparedRequest>(request);
    return Translate(*own, request);
  }
  if (!absl::IsNotFound(own.status())) return own.status();
  // A record of a range of sizes that holds the request's: the narrowest.
  ASSIGN_OR_RETURN(std::vector<db::FamilyBestRow> rows, db_->BestsOfFamily(request.family.key, request.target_fp, Salt()));
  const Member* cover = nullptr;
  double narrowest = std::numeric_limits<double>::infinity();
  std::vector<Member> members = MembersOf(rows, request.family.key);
  for (const Member& m : members) {
    if (m.row.target_fp != request.target_fp || m.row.salt != Salt() ||
        !ir::Covers(m.chain, m.family, request.chain, request.family)) {
      continue;
    }
    const double width = ir::SizeDistance(m.chain, m.family, request.chain, request.family);
    if (width < narrowest) {
      narrowest = width;
      cover = &m;
    }
  }
  if (cover == nullptr) return own.status();
  ASSIGN_OR_RETURN(ir::Chain resized, ir::WithSizesOf(request.chain, request.family, cover->chain, cover->family));
  ASSIGN_OR_RETURN(PreparedRequest at, PrepareFor(resized, request.target_fp));
  if (at.canonical.key != cover->row.workload.key) return own.status();
  ASSIGN_OR_RETURN(TuneResult r, ResultFromBest(cover->row.workload.key, request.target_fp, true));
  r = Translate(r, at);
  if (r.answer == AnswerKind::kTuned) {
    r.answer = AnswerKind::kCovered;
    r.source_key = cover->row.workload.key;
    r.source_chain = cover->row.workload.canonical_text;
  }
  if (served != nullptr) *served = std::make_shared<const PreparedRequest>(std::move(at));
  return r;
}

absl::StatusOr<Scheduler::Transfer> Scheduler::FindTransfer(const PreparedRequest& request) {
  ASSIGN_OR_RETURN(std::vector<db::FamilyBestRow> rows, db_->BestsOfFamily(request.family.key, request.target_fp, Salt()));
  std::vector<Member> members = MembersOf(rows, request.family.key);
  std::sort(members.begin(), members.end(), [&](const Member& a, const Member& b) {
    return ir::SizeDistance(a.chain, a.family, request.chain, request.family) <
           ir::SizeDistance(b.chain, b.family, request.chain, request.family);
  });
  for (const Member& m : members) {
    if (m.row.target_fp != request.target_fp || m.row.salt != Salt()) continue;
    // A schedule that failed here once (refused, or never confirmed) would fail again.
    ASSIGN_OR_RETURN(bool failed, db_->TransferFailed(request.canonical.key, request.target_fp, Salt(),
                                                      m.row.workload.key));
    if (failed) continue;
    ASSIGN_OR_RETURN(db::CandidateRow source, db_->GetCandidate(m.row.best.candidate_id));
    if (space::IsSplitText(source.schedule) || !space::UnfusedVendor(source.schedule).empty()) continue;
    // The record's schedule in the request's canonical names, its tiles no
    // longer than the request's dims.
    const ir::Chain& to = request.canonical.chain;
    const ir::CanonicalForm to_family = ir::CanonicalFamily(to);
    const size_t n = m.family.chain.dims.size();
    const std::vector<int> from_dims = ir::FamilyDims(m.family, n);
    std::vector<int> dim_map(to.dims.size(), -1), tensor_map(to.tensors.size(), -1);
    for (size_t d = 0; d < to.dims.size(); ++d) {
      const int f = to_family.dim_map[d];
      if (f >= 0 && static_cast<size_t>(f) < n) dim_map[d] = from_dims[f];
    }
    for (size_t t = 0; t < to.tensors.size(); ++t) {
      const int f = to_family.tensor_map[t];
      for (size_t u = 0; u < m.family.tensor_map.size(); ++u) {
        if (f >= 0 && m.family.tensor_map[u] == f) tensor_map[t] = static_cast<int>(u);
      }
    }
    const std::string fitted = TranslateFused(source.schedule, m.chain, to, dim_map, tensor_map, /*fit=*/true);
    absl::StatusOr<space::Schedule> schedule = space::ParseSchedule(fitted, to);
    if (!schedule.ok()) continue;
    absl::StatusOr<space::RankedSchedule> ranked = space::EvaluateSchedule(to, request.target, *schedule);
    if (!ranked.ok()) continue;
    Transfer t;
    t.source = m.row;
    t.schedule = space::ScheduleToText(ranked->schedule, to);
    t.mapping = ranked->mappings;
    t.prediction = ranked->prediction;
    return t;
  }
  return absl::NotFoundError(absl::StrCat("no record of chain '", request.chain.name, "' at other sizes on target ",
                                          request.target_fp, " whose schedule fits"));
}

absl::StatusOr<TuneResult> Scheduler::LookupOrTransfer(const PreparedRequest& request,
                                                       std::shared_ptr<const PreparedRequest>* served) {
  absl::StatusOr<TuneResult> found = Lookup(request, served);
  if (found.ok() || !absl::IsNotFound(found.status())) return found;
  absl::StatusOr<Transfer> transfer = FindTransfer(request);
  if (!transfer.ok()) return absl::IsNotFound(transfer.status()) ? found.status() : transfer.status();
  TuneResult r;
  r.from_cache = true;
  r.workload_key = request.canonical.key;
  r.target_fp = request.target_fp;
  r.target = request.target;
  r.best.schedule = transfer->schedule;
  r.best.mapping = transfer->mapping;
  r.best.t_mem_s = transfer->prediction.t_mem_s;
  r.best.t_comp_s = transfer->prediction.t_comp_s;
  r.best.alpha = transfer->prediction.alpha;
  r.best.t_estm_s = transfer->prediction.t_estm_s;
  r.answer = AnswerKind::kTransferred;
  r.validated = false;
  r.source_key = transfer->source.workload.key;
  r.source_chain = transfer->source.workload.canonical_text;
  if (served != nullptr) *served = std::make_shared<const PreparedRequest>(request);
  return Translate(r, request);
}

absl::StatusOr<Explanation> Scheduler::Explain(const PreparedRequest& request) {
  Explanation why;
  why.workload_key = request.canonical.key;
  why.family_key = request.family.key;
  ASSIGN_OR_RETURN(std::vector<db::FamilyBestRow> rows, db_->BestsOfFamily(request.family.key, request.target_fp, Salt()));
  const bool same_family = !rows.empty();
  if (!same_family) {
    ASSIGN_OR_RETURN(rows, db_->BestsNamed(request.chain.name, request.target_fp, Salt()));
  }
  std::vector<Member> members = MembersOf(rows, same_family ? request.family.key : "");
  // Nearest: on this target, with this salt, of the closest sizes (of dims at the same places).
  auto distance = [&](const Member& m) {
    double d = (m.row.target_fp != request.target_fp ? 1000.0 : 0.0) + (m.row.salt != Salt() ? 100.0 : 0.0);
    if (m.family.chain.dims.size() == request.family.chain.dims.size()) {
      d += ir::SizeDistance(m.chain, m.family, request.chain, request.family);
    }
    return d;
  };
  const Member* nearest = nullptr;
  for (const Member& m : members) {
    if (m.row.workload.key == request.canonical.key && m.row.target_fp == request.target_fp &&
        m.row.salt == Salt()) {
      continue;  // the request's own record: nothing to explain
    }
    if (nearest == nullptr || distance(m) < distance(*nearest)) nearest = &m;
  }
  if (nearest == nullptr) {
    why.summary = absl::StrCat("no record of this chain at any size (family ", why.family_key.substr(0, 12),
                               "), nor of any chain named '", request.chain.name, "', on any target");
    return why;
  }
  why.nearest_key = nearest->row.workload.key;
  why.nearest_chain = nearest->row.workload.canonical_text;
  why.nearest_target_fp = nearest->row.target_fp;
  why.nearest_salt = nearest->row.salt;
  // The chains with their sizes left open, line by line (dtype, inputs'
  // layouts, ops), then the sizes of the dims at the same places.
  const std::vector<std::string> a = Lines(request.family.text), b = Lines(nearest->family.text);
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string wanted = i < a.size() ? a[i] : "", found = i < b.size() ? b[i] : "";
    const std::string head = wanted.substr(0, wanted.find(' '));
    if (wanted == found || head == "chain" || head == "dim") continue;
    const bool named = head == "dtype" || head == "in" || head == "const" || head == "out";
    why.differences.push_back({named ? head : absl::StrCat("op ", i + 1), wanted, found});
  }
  if (request.family.chain.dims.size() == nearest->family.chain.dims.size()) {
    const size_t n = request.family.chain.dims.size();
    const std::vector<int> mine = ir::FamilyDims(request.family, n), theirs = ir::FamilyDims(nearest->family, n);
    for (size_t f = 0; f < n; ++f) {
      if (mine[f] < 0 || theirs[f] < 0) continue;
      const std::string wanted = ir::ExtentText(request.chain.dims[mine[f]]);
      const std::string found = ir::ExtentText(nearest->chain.dims[theirs[f]]);
      if (wanted != found) why.differences.push_back({"dim " + request.chain.dims[mine[f]].name, wanted, found});
    }
  }
  if (nearest->row.target_fp != request.target_fp) {
    why.differences.push_back({"target", request.target_fp, nearest->row.target_fp});
    absl::StatusOr<hw::TargetDesc> other = TargetOf(nearest->row.target_fp);
    if (other.ok()) {
      const auto want = TargetFields(request.target), have = TargetFields(*other);
      for (size_t i = 0; i < want.size(); ++i) {
        if (want[i].second != have[i].second) {
          why.differences.push_back({"target " + want[i].first, want[i].second, have[i].second});
        }
      }
    }
  }
  if (nearest->row.salt != Salt()) why.differences.push_back({"salt", Salt(), nearest->row.salt});
  std::vector<std::string> parts;
  for (const Difference& d : why.differences) parts.push_back(absl::StrCat(d.field, " (", d.wanted, " vs ", d.found, ")"));
  why.summary = absl::StrCat("nearest record: workload ", why.nearest_key, " on target ", why.nearest_target_fp,
                             parts.empty() ? "" : "; it differs in ", absl::StrJoin(parts, ", "));
  return why;
}

}  // namespace fusor::server
