// The learned cost models a scheduler keeps per target, and the
// measurements they learn from.
#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"
#include "server/db/tuning_db.h"

namespace fusor::db {
namespace {

constexpr char kCostModelColumns[] =
    "id, target_fp, model_json, samples, workloads, spearman_analytical, spearman_learned, created_ms";

CostModelRow ReadCostModel(const Statement& s) {
  CostModelRow r;
  r.id = s.Int(0);
  r.target_fp = s.Text(1);
  r.model_json = s.Text(2);
  r.samples = static_cast<int>(s.Int(3));
  r.workloads = static_cast<int>(s.Int(4));
  r.spearman_analytical = s.Double(5);
  r.spearman_learned = s.Double(6);
  r.created_ms = s.Int(7);
  return r;
}

// Candidate measurements (not baselines, not confirmations, which repeat a
// candidate) that were trusted.
constexpr char kTrainingFrom[] = R"sql(
FROM measurements m
JOIN candidates c ON c.id = m.candidate_id
JOIN tasks t ON t.id = m.task_id
WHERE m.target_fp = ?1 AND m.kind = ?2 AND m.status = ?3 AND m.median_s > 0
)sql";

}  // namespace

absl::StatusOr<int64_t> TuningDb::InsertCostModel(const CostModelRow& r) {
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Statement s, db_->Prepare("INSERT INTO cost_models(target_fp, model_json, samples, workloads, "
                                             "spearman_analytical, spearman_learned, created_ms) "
                                             "VALUES (?,?,?,?,?,?,?)"));
  s.Bind(1, r.target_fp).Bind(2, r.model_json).Bind(3, r.samples).Bind(4, r.workloads);
  s.Bind(5, r.spearman_analytical).Bind(6, r.spearman_learned).Bind(7, r.created_ms);
  RETURN_IF_ERROR(s.Run());
  return db_->LastInsertRowId();
}

absl::StatusOr<CostModelRow> TuningDb::GetCostModel(int64_t id) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare(absl::StrCat("SELECT ", kCostModelColumns, " FROM cost_models WHERE id = ?")));
  s.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return absl::NotFoundError(absl::StrCat("no cost model ", id));
  return ReadCostModel(s);
}

absl::StatusOr<std::optional<CostModelRow>> TuningDb::LatestCostModel(const std::string& target_fp) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare(absl::StrCat("SELECT ", kCostModelColumns,
                                                         " FROM cost_models WHERE target_fp = ? ORDER BY id DESC "
                                                         "LIMIT 1")));
  s.Bind(1, target_fp);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<CostModelRow>();
  return std::optional<CostModelRow>(ReadCostModel(s));
}

absl::StatusOr<std::vector<TrainingRow>> TuningDb::TrainingRows(const std::string& target_fp) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare(absl::StrCat("SELECT m.workload_key, c.schedule, m.median_s, "
                                                         "t.bandwidth_bytes_per_s, t.peak_flops ",
                                                         kTrainingFrom, " ORDER BY m.id")));
  s.Bind(1, target_fp).Bind(2, Name(JobKind::kCandidate)).Bind(3, Name(MeasurementStatus::kOk));
  std::vector<TrainingRow> out;
  for (;;) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back({s.Text(0), s.Text(1), s.Double(2), s.Double(3), s.Double(4)});
  }
  return out;
}

absl::StatusOr<int64_t> TuningDb::CountTrainingRows(const std::string& target_fp) {
  Reader db = Read();
  ASSIGN_OR_RETURN(Statement s, db->Prepare(absl::StrCat("SELECT COUNT(*) ", kTrainingFrom)));
  s.Bind(1, target_fp).Bind(2, Name(JobKind::kCandidate)).Bind(3, Name(MeasurementStatus::kOk));
  ASSIGN_OR_RETURN(bool row, s.Step());
  return row ? s.Int(0) : 0;
}

}  // namespace fusor::db
