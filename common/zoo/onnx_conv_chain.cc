// The convolution chain pattern of the ONNX importer: Conv -> [Relu] ->
// 1x1 Conv.
#include "common/zoo/onnx_patterns.h"

#include <onnx/onnx_pb.h>

#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ir/parse.h"

namespace fusor::zoo::importer {

namespace {

// A 2-D convolution's attributes (one group, explicit pads).
struct ConvAttrs {
  int64_t stride = 1, dilation = 1;
  std::vector<int64_t> pads = {0, 0, 0, 0};  // ONNX order: y begin, x begin, y end, x end
};

std::variant<ConvAttrs, Reject> ReadConvAttrs(const onnx::NodeProto& n) {
  if (AttrInt(n, "group", 1) != 1) return Reject{absl::StrCat(Label(n), " is a grouped convolution")};
  ConvAttrs a;
  const std::vector<int64_t> pads = AttrInts(n, "pads");
  if (!pads.empty()) {
    if (pads.size() != 4) return Reject{absl::StrCat(Label(n), " has ", pads.size(), " pads, not 4 (2-D)")};
    for (int64_t p : pads) {
      if (p < 0) return Reject{absl::StrCat(Label(n), " has a negative pad")};
    }
    a.pads = pads;
  }
  for (const onnx::AttributeProto& at : n.attribute()) {
    if (at.name() == "auto_pad" && at.s() != "NOTSET" && at.s() != "VALID") {
      return Reject{absl::StrCat(Label(n), " pads with auto_pad ", at.s(), "; export with explicit pads")};
    }
  }
  const std::vector<int64_t> strides = AttrInts(n, "strides"), dilations = AttrInts(n, "dilations");
  a.stride = strides.empty() ? 1 : strides[0];
  a.dilation = dilations.empty() ? 1 : dilations[0];
  if ((strides.size() == 2 && strides[1] != a.stride) || (dilations.size() == 2 && dilations[1] != a.dilation)) {
    return Reject{absl::StrCat(Label(n), " has different strides or dilations per axis")};
  }
  if (a.stride < 1 || a.dilation < 1) return Reject{absl::StrCat(Label(n), " has a stride or dilation below 1")};
  return a;
}

// The shape of `t`, which must be 4-D (NCHW).
std::variant<std::vector<int64_t>, Reject> Shape4d(const Graph& g, const std::string& t) {
  auto s = g.Shape(t);
  std::string why;
  if (Failed(s, &why)) return Reject{why};
  if (std::get<std::vector<int64_t>>(s).size() != 4) return Reject{absl::StrCat("'", t, "' is not 4-D (NCHW)")};
  return s;
}

}  // namespace

// Conv -> [Relu] -> 1x1 Conv starting at `first` (2-D convolutions, one
// group). The chain's indices cannot express a padded border, so a padded
// first convolution reads its input zero-padded ahead of the kernel (the
// chain's X is the padded tensor; the source says so); the 1x1 must not pad.
std::variant<Match, Reject> MatchConvChain(const Graph& g, const onnx::NodeProto& first, int index) {
  std::vector<const onnx::NodeProto*> nodes = {&first};
  std::string cur = first.output(0);
  const onnx::NodeProto* relu = g.SoleConsumer(cur);
  if (relu != nullptr && relu->op_type() == "Relu") {
    nodes.push_back(relu);
    cur = relu->output(0);
  } else {
    relu = nullptr;
  }
  const onnx::NodeProto* second = g.SoleConsumer(cur);
  if (second == nullptr || second->op_type() != "Conv" || second->input(0) != cur) return Reject{};  // no candidate
  nodes.push_back(second);
  std::string why;
  auto a1 = ReadConvAttrs(first);
  if (Failed(a1, &why)) return Reject{why};
  auto a2 = ReadConvAttrs(*second);
  if (Failed(a2, &why)) return Reject{why};
  const ConvAttrs& c1 = std::get<ConvAttrs>(a1);
  const ConvAttrs& c2 = std::get<ConvAttrs>(a2);
  const int64_t stride = c1.stride, dilation = c1.dilation;
  if (c2.stride != 1 || c2.dilation != 1 || c2.pads != std::vector<int64_t>{0, 0, 0, 0}) {
    return Reject{absl::StrCat(Label(*second), " is not an unpadded 1x1 convolution of stride 1")};
  }
  auto xs = Shape4d(g, first.input(0));
  auto w1s = Shape4d(g, first.input(1));
  auto ts = Shape4d(g, first.output(0));
  auto w2s = Shape4d(g, second->input(1));
  for (const auto* v : {&xs, &w1s, &ts, &w2s}) {
    if (Failed(*v, &why)) return Reject{why};
  }
  const std::vector<int64_t>& X = std::get<std::vector<int64_t>>(xs);
  const std::vector<int64_t>& W1 = std::get<std::vector<int64_t>>(w1s);
  const std::vector<int64_t>& T = std::get<std::vector<int64_t>>(ts);
  const std::vector<int64_t>& W2 = std::get<std::vector<int64_t>>(w2s);
  if (W2[2] != 1 || W2[3] != 1) return Reject{absl::StrCat(Label(*second), " is not a 1x1 convolution")};
  const bool bias1 = first.input_size() > 2 && !first.input(2).empty();
  const bool bias2 = second->input_size() > 2 && !second->input(2).empty();
  auto at = [&](const char* out, const char* k) {
    return absl::StrCat(out, stride == 1 ? "" : absl::StrCat("*", stride), "+", k,
                        dilation == 1 ? "" : absl::StrCat("*", dilation));
  };
  const std::vector<int64_t>& pad = c1.pads;
  const bool padded = pad != std::vector<int64_t>{0, 0, 0, 0};
  std::string text = absl::StrCat(
      "chain conv_chain_", index, padded ? "_padded" : "", "\ndtype ", DTypeOf(g, first.input(0)), "\ndim n=", X[0],
      " c=", X[1], " y=", X[2] + pad[0] + pad[2], " x=", X[3] + pad[1] + pad[3], " k=", W1[0], " r=", W1[2], " s=", W1[3], " p=", T[2], " q=", T[3], " j=", W2[0],
      "\nin X[n,c,y,x] W1[k,c,r,s] W2[j,k,1,1]", bias1 ? " B1[k]" : "", bias2 ? " B2[j]" : "", "\n",
      "T[n,k,p,q] = sum(c,r,s) X[n,c,", at("p", "r"), ",", at("q", "s"), "] * W1[k,c,r,s]\n");
  const bool u = relu != nullptr || bias1;  // T's bias and Relu make U
  if (u) {
    const std::string in = bias1 ? "T[n,k,p,q] + B1[k]" : "T[n,k,p,q]";
    absl::StrAppend(&text, "U[n,k,p,q] = ", relu != nullptr ? absl::StrCat("relu(", in, ")") : in, "\n");
  }
  absl::StrAppend(&text, "O[n,j,p,q] = sum(k) ", u ? "U" : "T", "[n,k,p,q] * W2[j,k,0,0]\n");
  absl::StrAppend(&text, bias2 ? "Z[n,j,p,q] = O[n,j,p,q] + B2[j]\nout Z\n" : "out O\n");
  auto chain = ir::ParseChainText(text);
  if (!chain.ok()) return Reject{std::string(chain.status().message())};
  MarkConstants(g, *chain, {{"W1", first.input(1)}, {"W2", second->input(1)},
                            {"B1", bias1 ? first.input(2) : ""}, {"B2", bias2 ? second->input(2) : ""}});
  std::string note;
  if (padded) {
    note = absl::StrCat("X is '", first.input(0), "' zero-padded ahead of the kernel to ", X[2] + pad[0] + pad[2],
                        "x", X[3] + pad[1] + pad[3], " (pads ", absl::StrJoin(pad, ","), ")");
  }
  return Match{std::move(*chain), nodes, note};
}

}  // namespace fusor::zoo::importer
