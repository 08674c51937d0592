#include "client/cli_inspect.h"

#include <iostream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "client/explain.h"
#include "client/extract.h"
#include "client/mappings.h"
#include "client/reference_data.h"
#include "client/report.h"
#include "common/hw/devices.h"
#include "common/util/log.h"
#include "proto/wire/convert.h"

namespace fusor::cli {

void AddReference(CLI::App& app, ReferenceCommand& c) {
  c.cmd = app.add_subcommand(
      "reference", "write a chain's validation inputs and float64 reference outputs (raw float64 files and "
                   "manifest.json), to check other implementations against");
  c.cmd->add_option("file", c.file, "workload file")->required()->check(CLI::ExistingFile);
  c.cmd->add_option("--seed", c.seed, "seed of the random inputs")->capture_default_str();
  c.cmd->add_option("-o,--out", c.out_dir, "output directory")->capture_default_str();
}

// reference: fusor's validation inputs and float64 outputs, on disk.
int RunReference(const ReferenceCommand& c) {
  auto workload = fusor::client::ReadWorkloadFile(c.file);
  if (!workload.ok()) return Fail(workload.status());
  auto chain = fusor::wire::ChainFromWorkload(*workload);
  if (!chain.ok()) return Fail(chain.status());
  auto written = fusor::client::WriteReferenceData(*chain, c.seed, c.out_dir);
  if (!written.ok()) return Fail(written.status());
  for (size_t i = 0; i < written->size(); ++i) std::cout << (i == 0 ? "wrote      " : "           ") << (*written)[i] << "\n";
  return 0;
}

void AddExplain(CLI::App& app, GlobalOptions& g, ExplainCommand& c) {
  c.cmd = app.add_subcommand(
      "explain", "show the schedule space at every pruning stage and the best predicted schedules (no measuring); "
                 "--target takes local (default), a device (" + absl::StrJoin(fusor::hw::DeviceNames(), ", ") +
                     ") or a registered target's fingerprint");
  c.cmd->add_option("file", c.file, "workload file")->required()->check(CLI::ExistingFile);
  c.cmd->add_option("--top", c.top, "candidates to list")->capture_default_str();
  c.cmd->add_option("--target", g.target_fp, "local (default), a device name, or a registered fingerprint");
  c.cmd->add_flag("!--no-dedupe", c.space_options.dedupe, "keep equivalent schedules (rule 1 off)");
  c.cmd->add_flag("!--no-intermediates-rule", c.space_options.limit_intermediates, "rule 2 off");
  c.cmd->add_flag("!--no-padding-rule", c.space_options.limit_padding, "rule 3 off");
  c.cmd->add_flag("!--no-scratch-rule", c.space_options.limit_scratch, "rule 4 off");
}

int RunExplain(const GlobalOptions& g, const ExplainCommand& c) {
  fusor::SetLogLevel("warn");
  auto workload = fusor::client::ReadWorkloadFile(c.file);
  if (!workload.ok()) return Fail(workload.status());
  auto chain = fusor::wire::ChainFromWorkload(*workload);
  if (!chain.ok()) return Fail(chain.status());
  auto target = ExplainTarget(g);
  if (!target.ok()) return Fail(target.status());
  auto space = fusor::space::BuildSpace(*chain, *target, c.space_options);
  if (!space.ok()) return Fail(space.status());
  std::cout << fusor::client::FormatExplain(*chain, *target, *space, c.top);
  return 0;
}

void AddMappings(CLI::App& app, GlobalOptions& g, MappingsCommand& c) {
  c.cmd = app.add_subcommand(
      "mappings", "list every mapping of the chains' sum ops onto the target's intrinsics, valid or why not");
  c.cmd->add_option("files", c.files, "workload files")->required()->check(CLI::ExistingFile);
  c.cmd->add_option("--target", g.target_fp, "local (default), a device name, or a registered fingerprint");
  c.cmd->add_option("--intrinsic", c.intrinsic_name, "only this intrinsic (any, whatever the target)");
  c.cmd->add_flag("--summary", c.summary, "one markdown row of counts per op");
}

int RunMappings(const GlobalOptions& g, const MappingsCommand& c) {
  fusor::SetLogLevel("warn");
  std::vector<const fusor::hw::Intrinsic*> intrinsics;
  if (!c.intrinsic_name.empty()) {
    const fusor::hw::Intrinsic* x = fusor::hw::FindIntrinsic(c.intrinsic_name);
    if (x == nullptr) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("unknown intrinsic '", c.intrinsic_name, "'")));
    }
    intrinsics.push_back(x);
  }
  if (c.summary) std::cout << fusor::client::MappingSummaryHeader();
  for (const std::string& file : c.files) {
    auto workload = fusor::client::ReadWorkloadFile(file);
    if (!workload.ok()) return Fail(workload.status());
    auto chain = fusor::wire::ChainFromWorkload(*workload);
    if (!chain.ok()) return Fail(chain.status());
    if (intrinsics.empty()) {
      auto target = ExplainTarget(g);
      if (!target.ok()) return Fail(target.status());
      intrinsics = fusor::space::UsableIntrinsics(*chain, *target);
    }
    if (c.summary) {
      for (const fusor::hw::Intrinsic* x : intrinsics) {
        std::cout << fusor::client::MappingSummaryRows(WorkloadName(file), *chain, *x);
      }
    } else {
      std::cout << "# " << file << "\n" << fusor::client::FormatMappings(*chain, intrinsics);
    }
  }
  return 0;
}

void AddExtract(CLI::App& app, ExtractCommand& c) {
  c.cmd = app.add_subcommand(
      "extract", "list the fusible chains of a model description (examples/models/*.json), optionally as chain files");
  c.cmd->add_option("file", c.file, "model description (JSON)")->required()->check(CLI::ExistingFile);
  c.cmd->add_option("--dim", c.dim_bindings, "bind batch, seq or target_seq, e.g. --dim seq=512 (repeatable)");
  c.cmd->add_option("-o,--out", c.out_dir, "write each chain to DIR/<chain>.fusor");
}

int RunExtract(const ExtractCommand& c) {
  std::map<std::string, int64_t> dims;
  for (const std::string& b : c.dim_bindings) {
    auto dim = fusor::client::ParseDimBinding(b);
    if (!dim.ok()) {
      Fail(dim.status());
      return 2;  // usage
    }
    dims[dim->first] = dim->second;
  }
  auto extraction = fusor::client::ExtractModel(c.file, dims);
  if (!extraction.ok()) return Fail(extraction.status());
  std::cout << fusor::client::FormatExtraction(*extraction);
  if (c.out_dir.empty()) return 0;
  auto written = fusor::client::WriteExtraction(*extraction, c.out_dir);
  if (!written.ok()) return Fail(written.status());
  for (const std::string& path : *written) std::cout << "wrote " << path << "\n";
  return 0;
}

}  // namespace fusor::cli
