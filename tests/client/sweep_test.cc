// Zoo manifests (YAML and JSON) and the sweep's report files.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <onnx/onnx_pb.h>

#include <variant>

#include "absl/strings/str_split.h"
#include "client/client.h"
#include "client/extract.h"
#include "client/manifest.h"
#include "client/sweep_report.h"

namespace fusor::client {
namespace {

using ::testing::HasSubstr;

const std::string kSource = FUSOR_SOURCE_DIR;

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("fusor-manifest-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_ / "models");
    Write("models/tiny.json", R"({"model": "tiny", "architecture": "encoder", "hidden": 64, "heads": 2,
      "ffn": 128, "layers": 3, "activation": "relu", "mask": "none", "seq": 16, "batch": 1, "dtype": "f32"})");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  absl::Status Error(const std::string& yaml) { return LoadManifest(Write("bad.yaml", yaml)).status(); }
  std::filesystem::path dir_;
};

TEST_F(ManifestTest, ExpandsEveryCombinationOfSizes) {
  auto m = LoadManifest(Write("zoo.yaml", R"(# a comment
name: small
budget: 3
models:
  - description: models/tiny.json
    batch: [1, 2]
    seq: [8, 16]
  - description: models/tiny.json
    name: tiny-long
    dims: {seq: 32}
)"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "small");
  EXPECT_EQ(m->budget, 3);
  ASSERT_EQ(m->models.size(), 2u);
  EXPECT_EQ(m->models[0].path, (dir_ / "models/tiny.json").string());
  std::vector<std::string> seen;
  auto models = ExtractManifest(*m, [&](const SweepModel& s) { seen.push_back(s.name); });
  ASSERT_TRUE(models.ok()) << models.status();
  EXPECT_THAT(seen, ::testing::ElementsAre("tiny (batch=1, seq=8)", "tiny (batch=1, seq=16)", "tiny (batch=2, seq=8)",
                                           "tiny (batch=2, seq=16)", "tiny-long (seq=32)"));
  // An encoder: attention and FFN, each run by its 3 layers.
  ASSERT_EQ((*models)[0].extraction.chains.size(), 2u);
  EXPECT_EQ((*models)[0].extraction.chains[0].instances, 3);
  v1::SweepRequest req = MakeSweepRequest(*m, *models);
  EXPECT_EQ(req.name(), "small");
  EXPECT_EQ(req.options().budget(), 3);
  ASSERT_EQ(req.entries_size(), 10);
  EXPECT_EQ(req.entries(0).model(), "tiny (batch=1, seq=8)");
  EXPECT_EQ(req.entries(0).instances(), 3);
  EXPECT_FALSE(req.entries(0).chain().ops().empty());
  // The same manifest as JSON, named after the file.
  auto json = LoadManifest(Write("zoo.json", R"({"models": [{"description": "models/tiny.json", "seq": 8}]})"));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->name, "zoo");
  EXPECT_EQ(json->budget, 0);
  ASSERT_TRUE(ExtractManifest(*json).ok());
}

TEST_F(ManifestTest, ErrorsNameTheLineAndTheKey) {
  auto st = Error("models:\n  - description: models/tiny.json\n    sequence: 8\n");
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_THAT(std::string(st.message()), HasSubstr("bad.yaml:3: models[0]: unknown key 'sequence'"));
  st = Error("models:\n  - description: models/tiny.json\n    seq: [8, 0]\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("models[0].seq must be a positive integer"));
  st = Error("models:\n  - description: models/nothere.json\n");
  EXPECT_TRUE(absl::IsNotFound(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("no such file"));
  st = Error("models:\n  - description: models/tiny.json\n    onnx: models/tiny.json\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("exactly one of 'description'"));
  st = Error("models:\n  - seq: 8\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("exactly one of"));
  st = Error("models: []\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("non-empty list"));
  st = Error("name: x\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("no 'models'"));
  st = Error("models:\n  - description: [unclosed\n");
  EXPECT_TRUE(absl::IsInvalidArgument(st));
  EXPECT_THAT(std::string(st.message()), HasSubstr("bad.yaml:"));
  st = Error("budget: lots\nmodels:\n  - description: models/tiny.json\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("bad.yaml:1: budget must be a positive integer"));
  st = Error("models:\n  - description: models/tiny.json\n    seq: 8\n    dims: {seq: 16}\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("dim 'seq' given twice"));
  EXPECT_TRUE(absl::IsNotFound(LoadManifest((dir_ / "none.yaml").string()).status()));

  // Well-formed, but a model cannot be extracted or appears twice.
  auto m = LoadManifest(Write("two.yaml", "models:\n  - description: models/tiny.json\n    dims: {heads: 4}\n"));
  ASSERT_TRUE(m.ok());
  auto x = ExtractManifest(*m);
  EXPECT_FALSE(x.ok());
  EXPECT_THAT(std::string(x.status().message()), HasSubstr("models/tiny.json' at heads=4: "));
  EXPECT_THAT(std::string(x.status().message()), HasSubstr("heads=4"));
  m = LoadManifest(Write("dup.yaml", "models:\n  - description: models/tiny.json\n  - description: models/tiny.json\n"));
  ASSERT_TRUE(m.ok());
  x = ExtractManifest(*m);
  EXPECT_THAT(std::string(x.status().message()), HasSubstr("'tiny' is listed twice"));
}

// A sweep's name makes its report's directory: one that would climb out of
// the working directory is refused, and a file's stem is made safe (issue
// 36, finding 5).
TEST_F(ManifestTest, NamesCannotLeadOutOfTheWorkingDirectory) {
  for (const std::string name : {"x/../../../../tmp/elsewhere", "..", "a b", "/tmp/x"}) {
    const absl::Status st = Error("name: \"" + name + "\"\nmodels:\n  - description: models/tiny.json\n");
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << name << ": " << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("sweep name")) << name;
  }
  const absl::Status model = Error("models:\n  - description: models/tiny.json\n    name: \"m\\n2026 fake\"\n");
  EXPECT_THAT(std::string(model.message()), HasSubstr("model name"));
  auto m = LoadManifest(Write("we ird$name.yaml", "models:\n  - description: models/tiny.json\n"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "we_ird_name");
}

// An ONNX model in a manifest, its symbolic dim swept: a graph of
// MatMul -> Relu -> MatMul (weights never needed).
// Every file the CLI reads is bounded in size and nesting before it is
// parsed, as the scheduler bounds what it receives (issue 36, finding 8).
TEST_F(ManifestTest, FilesAreBoundedInSizeAndNestingBeforeTheyAreParsed) {
  const std::string deep = std::string(20000, '[') + std::string(20000, ']');
  const std::string chain_deep = "{\"inputs\": " + deep + "}";
  const std::string big = "{\"text\": \"" + std::string(200 << 10, 'x') + "\"}";
  auto workload = ReadWorkloadFile(Write("deep.json", chain_deep));
  EXPECT_TRUE(absl::IsInvalidArgument(workload.status())) << workload.status();
  EXPECT_THAT(std::string(workload.status().message()), HasSubstr("nests deeper than 32 levels"));
  workload = ReadWorkloadFile(Write("big.json", big));
  EXPECT_TRUE(absl::IsInvalidArgument(workload.status())) << workload.status();
  EXPECT_THAT(std::string(workload.status().message()), HasSubstr("larger than 65536 bytes"));
  workload = ReadWorkloadFile(Write("big.fusor", std::string(100 << 10, '#')));  // chain text too
  EXPECT_TRUE(absl::IsInvalidArgument(workload.status())) << workload.status();

  absl::Status st = Error("models: " + deep);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("nests deeper than 32 levels"));
  std::string block;  // a block sequence nested 1,000 deep on one line, and by indentation
  for (int i = 0; i < 1000; ++i) block += "- ";
  st = Error("models:\n  " + block + "x\n");
  EXPECT_THAT(std::string(st.message()), HasSubstr("bad.yaml:2: nests deeper than 256 columns"));
  block.clear();
  for (int i = 0; i < 300; ++i) block += std::string(i, ' ') + "- \n";
  EXPECT_THAT(std::string(Error("models:\n" + block).message()), HasSubstr("nests deeper than 256 columns"));
  st = Error("# " + std::string(kMaxManifestBytes, 'x'));
  EXPECT_THAT(std::string(st.message()), HasSubstr("larger than 1048576 bytes"));

  auto description = ExtractModel(Write("models/deep.json", "{\"model\": \"deep\", \"seq\": " + deep + "}"), {});
  EXPECT_TRUE(absl::IsInvalidArgument(description.status())) << description.status();
  EXPECT_THAT(std::string(description.status().message()), HasSubstr("nests deeper than 32 levels"));
  description = ExtractModel(Write("models/big.json", std::string(kMaxDescriptionBytes + 1, ' ')), {});
  EXPECT_THAT(std::string(description.status().message()), HasSubstr("larger than 1048576 bytes"));
}

TEST_F(ManifestTest, OnnxModelsTakeTheirDims) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(13);
  onnx::GraphProto* g = model.mutable_graph();
  g->set_name("mlp");
  auto input = [&](const std::string& name, std::vector<std::variant<int64_t, std::string>> dims) {
    auto* t = g->add_input();
    t->set_name(name);
    t->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
    for (const auto& d : dims) {
      auto* dim = t->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim();
      if (std::holds_alternative<int64_t>(d)) dim->set_dim_value(std::get<int64_t>(d));
      else dim->set_dim_param(std::get<std::string>(d));
    }
  };
  input("x", {std::string("tokens"), 32});
  input("w1", {32, 64});
  input("w2", {64, 32});
  auto node = [&](const std::string& op, std::vector<std::string> in, const std::string& out) {
    auto* n = g->add_node();
    n->set_op_type(op);
    for (const std::string& i : in) n->add_input(i);
    n->add_output(out);
  };
  node("MatMul", {"x", "w1"}, "h");
  node("Relu", {"h"}, "r");
  node("MatMul", {"r", "w2"}, "y");
  g->add_output()->set_name("y");
  std::ofstream((dir_ / "models/mlp.onnx").string(), std::ios::binary) << model.SerializeAsString();

  auto m = LoadManifest(Write("onnx.yaml", "models:\n  - onnx: models/mlp.onnx\n    dims: {tokens: [16, 48]}\n"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->models[0].onnx);
  auto models = ExtractManifest(*m);
  ASSERT_TRUE(models.ok()) << models.status();
  ASSERT_EQ(models->size(), 2u);
  EXPECT_EQ((*models)[1].name, "mlp (tokens=48)");
  ASSERT_EQ((*models)[1].extraction.chains.size(), 1u);
  EXPECT_EQ((*models)[1].extraction.chains[0].chain.dims[0].extent, 48);
  // Unbound, the dim leaves nothing to fuse, and the extraction says why.
  m = LoadManifest(Write("unbound.yaml", "models:\n  - onnx: models/mlp.onnx\n"));
  ASSERT_TRUE(m.ok());
  models = ExtractManifest(*m);
  ASSERT_TRUE(models.ok()) << models.status();
  EXPECT_TRUE((*models)[0].extraction.chains.empty());
  ASSERT_FALSE((*models)[0].extraction.rejected.empty());
  EXPECT_THAT((*models)[0].extraction.rejected[0], HasSubstr("tokens"));
}

TEST(SweepExampleTest, TheExampleZooExtracts) {
  auto m = LoadManifest(kSource + "/examples/zoo.yaml");
  ASSERT_TRUE(m.ok()) << m.status();
  auto models = ExtractManifest(*m);
  ASSERT_TRUE(models.ok()) << models.status();
  EXPECT_GE(models->size(), 4u);
  for (const SweepModel& s : *models) EXPECT_FALSE(s.extraction.chains.empty()) << s.name;
}

v1::SweepChainResult Result(const std::string& model, const std::string& chain, const std::string& state, int runs,
                            double best_s, double baseline_s) {
  v1::SweepChainResult r;
  r.set_model(model);
  r.set_chain(chain);
  r.set_role("ffn, \"gated\"");
  r.set_source("layers 1-2");
  r.set_instances(runs);
  r.set_workload_key(chain + "-key");
  r.set_state(state);
  r.set_best_s(best_s);
  r.set_baseline_s(baseline_s);
  r.set_speedup(best_s > 0 && baseline_s > 0 ? baseline_s / best_s : 0);
  r.set_tuning_s(state == "tuned" ? 12.5 : 0);
  if (state == "failed") r.set_error("all 4 candidates failed");
  return r;
}

TEST(SweepReportTest, TotalsAndEveryFormat) {
  v1::SweepReport report;
  report.set_sweep_id("s-1");
  report.set_name("zoo");
  report.set_state("done");
  report.mutable_target()->set_arch("x86-64-avx2");
  report.mutable_target()->set_fingerprint("cpu-1");
  report.set_budget(4);
  *report.add_results() = Result("a <b>", "ffn", "tuned", 2, 1e-3, 3e-3);
  *report.add_results() = Result("a <b>", "attention", "cache", 2, 2e-3, 2e-3);
  *report.add_results() = Result("c", "attention2", "failed", 1, 0, 0);

  auto totals = TotalsPerModel(report);
  ASSERT_EQ(totals.size(), 2u);
  EXPECT_EQ(totals[0].chains, 2);
  EXPECT_EQ(totals[0].measured, 2);
  EXPECT_DOUBLE_EQ(totals[0].baseline_s, 2 * 3e-3 + 2 * 2e-3);
  EXPECT_DOUBLE_EQ(totals[0].fused_s, 2 * 1e-3 + 2 * 2e-3);
  EXPECT_DOUBLE_EQ(totals[0].speedup(), 10.0 / 6.0);
  EXPECT_EQ(totals[1].measured, 0);
  EXPECT_EQ(totals[1].speedup(), 0);

  std::vector<SweepModel> models(1);
  models[0].name = "c";
  models[0].extraction.rejected = {"node 'x' (Softmax): not the last axis"};
  const std::string md = SweepReportMarkdown(report, models);
  EXPECT_THAT(md, HasSubstr("| a &lt;b&gt; | 2 | 10 | 6 | 1.67x |"));
  EXPECT_THAT(md, HasSubstr("3 chains in 2 models, 3 distinct: 1 from the cache, 1 tuned (12.5 s of tuning), 1 failed"));
  EXPECT_THAT(md, HasSubstr("failed: all 4 candidates failed"));
  EXPECT_THAT(md, HasSubstr("- c: node 'x' (Softmax): not the last axis"));

  const std::string csv = SweepReportCsv(report);
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_THAT(lines[1], HasSubstr("a <b>,ffn,\"ffn, \"\"gated\"\"\",layers 1-2,2,ffn-key,tuned,1,3,3,12.50"));

  auto json = nlohmann::json::parse(SweepReportJson(report, models));
  ASSERT_EQ(json["models"].size(), 2u);
  EXPECT_DOUBLE_EQ(json["models"][0]["speedup"].get<double>(), 10.0 / 6.0);
  EXPECT_EQ(json["models"][0]["chains"][1]["result"], "cache");
  EXPECT_EQ(json["models"][1]["not_fused"].size(), 1u);

  const std::string svg = SweepReportSvg(report);
  EXPECT_EQ(svg.rfind("<svg ", 0), 0u);
  EXPECT_THAT(svg, HasSubstr("</svg>"));
  EXPECT_THAT(svg, HasSubstr("a &lt;b&gt;"));  // escaped
  EXPECT_THAT(svg, HasSubstr(">3.00x<"));      // the ffn's bar
  EXPECT_THAT(svg, HasSubstr(">failed<"));
}

// Names from outside reach every report escaped for its format (issue 36,
// finding 6): no line break, terminal escape or bidi control gets through,
// the CSV keeps one row per chain and no formula, and the SVG is XML that
// a parser reads.
TEST(SweepReportTest, HostileNamesAreEscapedInEveryFormat) {
  const std::vector<std::string> names = {
      "m\n2026-12-05 12:00:00.000 info [scheduler] a fake line", "\x1b[2J<script>&'x'</script>",
      "=HYPERLINK(\"http://evil\")", "rtl\xe2\x80\xaetxt.exe", "bad\xff\xfe", "ok"};
  v1::SweepReport report;
  report.set_sweep_id("s-2");
  report.set_name("zoo</title><a>");
  report.set_state("done");
  for (size_t i = 0; i < names.size(); ++i) {
    *report.add_results() = Result(names[i], "c" + std::to_string(i), i % 2 ? "tuned" : "failed", 1, 1e-3, 2e-3);
    report.mutable_results()->rbegin()->set_error(names[i]);
  }
  std::vector<SweepModel> models(1);
  models[0].name = names[0];
  models[0].extraction.rejected = {names[1]};
  const std::string md = SweepReportMarkdown(report, models), csv = SweepReportCsv(report),
                    json = SweepReportJson(report, models), svg = SweepReportSvg(report);
  for (const std::string* text : {&md, &csv, &json, &svg}) {
    EXPECT_EQ(text->find('\x1b'), std::string::npos);
    EXPECT_EQ(text->find("\xe2\x80\xae"), std::string::npos);
    EXPECT_EQ(text->find('\xff'), std::string::npos);
    EXPECT_EQ(text->find("\n2026-12-05"), std::string::npos);
  }
  EXPECT_EQ(md.find("<script>"), std::string::npos);
  std::vector<std::string> rows = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  EXPECT_EQ(rows.size(), names.size() + 1);
  EXPECT_THAT(csv, HasSubstr("\n\"'=HYPERLINK(\"\"http://evil\"\")\",c2,"));
  EXPECT_FALSE(nlohmann::json::parse(json, nullptr, false).is_discarded());
  // The SVG read by an XML parser (Python's, which Debian's python3 has).
  const auto path = std::filesystem::temp_directory_path() / ("fusor-sweep-" + std::to_string(getpid()) + ".svg");
  std::ofstream(path) << svg;
  const std::string parse = "python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' " + path.string();
  EXPECT_EQ(std::system(parse.c_str()), 0) << svg;
  std::filesystem::remove(path);
}

TEST(SweepReportTest, ProgressLine) {
  v1::SweepProgress p;
  p.set_chains(10);
  p.set_done(4);
  p.set_cache_hits(3);
  p.set_tuned(1);
  p.set_elapsed_s(75);
  p.set_eta_s(-1);
  v1::SweepChainProgress* t = p.add_tuning();
  t->set_chain("bert_ffn");
  t->set_measured(2);
  t->set_budget(8);
  EXPECT_EQ(FormatSweepProgress(p),
            "[########............] 4/10 chains: 3 from the cache, 1 tuned; tuning bert_ffn 2/8; 1m15s elapsed, ETA "
            "unknown yet");
  p.set_eta_s(3725);
  EXPECT_THAT(FormatSweepProgress(p), HasSubstr("ETA 1h02m"));
}

}  // namespace
}  // namespace fusor::client
