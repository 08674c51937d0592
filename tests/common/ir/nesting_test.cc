// Deeply nested workloads: every front end refuses them with a clear
// INVALID_ARGUMENT instead of recursing until the stack overflows, and the
// deepest workloads they accept go through every walker of the IR. All of
// it runs on a thread with a small stack, so that unbounded recursion
// crashes here rather than in a scheduler.
#include <google/protobuf/util/json_util.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <pthread.h>

#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/ir/canonical.h"
#include "common/ir/parse.h"
#include "common/ir/reference.h"
#include "proto/wire/convert.h"

namespace fusor::ir {
namespace {

using ::testing::HasSubstr;

// Runs `fn` on a thread with a 256 KiB stack (a server thread has 8 MiB).
void OnSmallStack(const std::function<void()>& fn) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 256 * 1024), 0);
  pthread_t thread;
  auto body = [](void* arg) -> void* {
    (*static_cast<const std::function<void()>*>(arg))();
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&thread, &attr, body, const_cast<std::function<void()>*>(&fn)), 0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
}

std::string Repeat(absl::string_view s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out.append(s.data(), s.size());
  return out;
}

std::string ChainWith(const std::string& op_line) {
  return absl::StrCat("chain deep\ndim m=8\nin A[m]\n", op_line, "\nout B\n");
}

// The index of the access nested `n` parentheses deep: what crashed the
// scheduler (9,000 levels, 18 KB).
std::string DeepIndex(int n) { return ChainWith(absl::StrCat("B[m] = A[", Repeat("(", n), "m", Repeat(")", n), "]")); }

void ExpectTooDeep(const absl::StatusOr<Chain>& chain, const std::string& what) {
  EXPECT_TRUE(absl::IsInvalidArgument(chain.status())) << what << ": " << chain.status();
  EXPECT_THAT(std::string(chain.status().message()), HasSubstr("deeper than")) << what;
}

TEST(NestingTest, TheOldCrashIsAClearError) {
  OnSmallStack([] {
    const std::string text = DeepIndex(9000);
    ASSERT_LT(text.size(), Limits().max_spec_bytes);
    ExpectTooDeep(ParseChainText(text), "text");
    ExpectTooDeep(ParseChain(text), "text, sniffed");

    v1::Workload as_text;
    as_text.set_text(text);
    ExpectTooDeep(wire::ChainFromWorkload(as_text), "Workload.text");

    // The same op as a structured chain, the way a gRPC client sends it.
    v1::Workload structured;
    v1::Chain* c = structured.mutable_chain();
    c->set_name("deep");
    auto* dim = c->add_dims();
    dim->set_name("m");
    dim->set_extent(8);
    auto* in = c->add_inputs();
    in->set_name("A");
    in->add_shape("m");
    auto* op = c->add_ops();
    op->set_output("B");
    op->add_index("m");
    op->set_expr(absl::StrCat("A[", Repeat("(", 9000), "m", Repeat(")", 9000), "]"));
    c->add_outputs("B");
    ExpectTooDeep(wire::ChainFromWorkload(structured), "Workload.chain");
    std::string json;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(structured, &json).ok());
    ExpectTooDeep(ParseChainJson(json), "Workload JSON");
  });
}

TEST(NestingTest, EveryKindOfNestingIsBounded) {
  OnSmallStack([] {
    const int n = 20000;
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"parenthesized value", ChainWith(absl::StrCat("B[m] = ", Repeat("(", n), "A[m]", Repeat(")", n)))},
        {"nested calls", ChainWith(absl::StrCat("B[m] = ", Repeat("exp(", n / 2), "A[m]", Repeat(")", n / 2)))},
        {"signs", ChainWith(absl::StrCat("B[m] = ", Repeat("- ", n), "A[m]"))},
        {"index signs", ChainWith(absl::StrCat("B[m] = A[", Repeat("-", n), "m]"))},
        {"index products", ChainWith(absl::StrCat("B[m] = A[", Repeat("(1*", n / 2), "m", Repeat(")", n / 2), "]"))},
    };
    for (const auto& [what, text] : cases) ExpectTooDeep(ParseChainText(text), what);
  });
}

TEST(NestingTest, DeepJsonIsRefusedBeforeParsing) {
  OnSmallStack([] {
    for (const std::string& json : {Repeat("[", 60000), absl::StrCat(Repeat("{\"a\":", 10000), "1", Repeat("}", 10000)),
                                    absl::StrCat("{\"chain\":", Repeat("[", 30000), Repeat("]", 30000), "}")}) {
      ExpectTooDeep(ParseChainJson(json), json.substr(0, 20));
      // protobuf's own JSON reader, which the CLI and tests use for
      // Workload JSON, refuses it too (its recursion limit).
      v1::Workload w;
      EXPECT_FALSE(google::protobuf::util::JsonStringToMessage(json, &w).ok());
    }
    // Brackets inside strings do not count.
    auto chain = ParseChainJson(absl::StrCat(R"({"name": ")", Repeat("[", 100), R"("})"));
    EXPECT_THAT(std::string(chain.status().message()), ::testing::Not(HasSubstr("deeper than")));
  });
}

TEST(NestingTest, HugeIndexCoefficientsAreErrorsNotOverflows) {
  for (const char* index : {"m*999999999999*999999999999", "999999999999*999999999999*m",
                                   "m*4294967296", "-(-(m*2147483647))*2147483647"}) {
    auto chain = ParseChainText(ChainWith(absl::StrCat("B[m] = A[", index, "]")));
    EXPECT_TRUE(absl::IsInvalidArgument(chain.status())) << index;
    EXPECT_THAT(std::string(chain.status().message()), HasSubstr("beyond")) << index;
  }
}

TEST(NestingTest, TheDeepestAcceptedChainGoesThroughEveryWalker) {
  OnSmallStack([] {
    // Calls and the index's parentheses count together.
    const int depth = Limits().max_expr_depth / 2 - 2;
    const std::string text = ChainWith(absl::StrCat("B[m] = ", Repeat("relu(", depth), "A[", Repeat("(", depth), "m",
                                                    Repeat(")", depth), "]", Repeat(")", depth)));
    auto chain = ParseChainText(text);
    ASSERT_TRUE(chain.ok()) << chain.status();
    const CanonicalForm canonical = Canonicalize(*chain);
    auto again = ParseChainText(ChainToText(*chain));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(Canonicalize(*again).key, canonical.key);
    auto from_json = ParseChainJson(ChainToJson(*chain));
    ASSERT_TRUE(from_json.ok()) << from_json.status();
    EXPECT_EQ(Canonicalize(*from_json).key, canonical.key);
    auto out = EvaluateReference(*chain, {{-1, 2, -3, 4, -5, 6, -7, 8}});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ((*out)[0], (std::vector<double>{0, 2, 0, 4, 0, 6, 0, 8}));
    auto proto = wire::ChainFromWorkload([&] {
      v1::Workload w;
      *w.mutable_chain() = wire::ChainToProto(*chain);
      return w;
    }());
    ASSERT_TRUE(proto.ok()) << proto.status();
  });
}

}  // namespace
}  // namespace fusor::ir
