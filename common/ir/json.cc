// The JSON front end: the proto3 JSON mapping of fusor.v1.Chain/Workload.
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/ir/parse.h"
#include "common/util/files.h"
#include "common/util/text.h"
#include "common/util/status_macros.h"

namespace fusor::ir {
namespace {

using Json = nlohmann::json;

absl::Status FieldError(const std::string& field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

std::string Sub(const std::string& parent, absl::string_view key) {
  return parent.empty() ? std::string(key) : absl::StrCat(parent, ".", key);
}

std::string Item(const std::string& parent, size_t i) { return absl::StrCat(parent, "[", i, "]"); }

absl::Status CheckKeys(const Json& obj, const std::string& field,
                       std::initializer_list<absl::string_view> allowed) {
  if (!obj.is_object()) return FieldError(field.empty() ? "workload" : field, "expected an object");
  for (const auto& [key, value] : obj.items()) {
    bool ok = false;
    for (absl::string_view a : allowed) ok = ok || key == a;
    if (!ok) return FieldError(Sub(field, Echo(key, 64)), "unknown field");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> GetString(const Json& obj, const std::string& parent,
                                      absl::string_view key, bool required) {
  auto it = obj.find(std::string(key));
  if (it == obj.end()) {
    if (required) return FieldError(Sub(parent, key), "missing");
    return std::string();
  }
  if (!it->is_string()) return FieldError(Sub(parent, key), "expected a string");
  return it->get<std::string>();
}

absl::StatusOr<std::vector<std::string>> GetStringList(const Json& obj, const std::string& parent,
                                                       absl::string_view key, bool allow_ints) {
  std::vector<std::string> out;
  auto it = obj.find(std::string(key));
  if (it == obj.end()) return out;
  std::string field = Sub(parent, key);
  if (!it->is_array()) return FieldError(field, "expected an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& v = (*it)[i];
    if (v.is_string()) {
      out.push_back(v.get<std::string>());
    } else if (allow_ints && v.is_number_integer()) {
      out.push_back(absl::StrCat(v.get<int64_t>()));
    } else {
      return FieldError(Item(field, i), allow_ints ? "expected a dim name or integer" : "expected a string");
    }
  }
  return out;
}

// proto3 JSON writes int64 as a string; accept both forms.
absl::StatusOr<int64_t> GetInt64(const Json& obj, const std::string& parent, absl::string_view key) {
  std::string field = Sub(parent, key);
  auto it = obj.find(std::string(key));
  if (it == obj.end()) return FieldError(field, "missing");
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return FieldError(field, "out of range");
  }
  if (it->is_number_integer()) return it->get<int64_t>();
  int64_t value = 0;
  if (it->is_string() && absl::SimpleAtoi(it->get<std::string>(), &value)) return value;
  return FieldError(field, "expected an integer");
}

absl::StatusOr<OpKind> ParseOpKind(const std::string& s, const std::string& field) {
  if (s == "sum" || s == "OP_KIND_SUM") return OpKind::kSum;
  if (s == "softmax" || s == "OP_KIND_SOFTMAX") return OpKind::kSoftmax;
  if (s == "map" || s == "OP_KIND_MAP" || s.empty()) return OpKind::kMap;
  return FieldError(field, absl::StrCat("unknown op kind '", Echo(s), "' (expected sum, softmax or map)"));
}

absl::StatusOr<ChainSpec> SpecFromJson(const Json& root) {
  RETURN_IF_ERROR(CheckKeys(root, "", {"name", "dtype", "dims", "inputs", "ops", "outputs"}));
  ChainSpec spec;
  spec.where = Where{"workload", 0, 0};
  ASSIGN_OR_RETURN(spec.name, GetString(root, "", "name", false));
  ASSIGN_OR_RETURN(std::string dtype, GetString(root, "", "dtype", false));
  if (!dtype.empty() && dtype != "DTYPE_UNSPECIFIED") {
    auto d = ParseDType(dtype);
    if (!d.ok()) return FieldError("dtype", d.status().message());
    spec.dtype = *d;
  }
  for (absl::string_view list : {"dims", "inputs", "ops"}) {
    auto it = root.find(std::string(list));
    if (it != root.end() && !it->is_array()) return FieldError(std::string(list), "expected an array");
  }
  if (root.contains("dims")) {
    const Json& dims = root["dims"];
    for (size_t i = 0; i < dims.size(); ++i) {
      std::string field = Item("dims", i);
      RETURN_IF_ERROR(CheckKeys(dims[i], field, {"name", "extent", "min"}));
      DimSpec d;
      d.where = Where{field, 0, 0};
      ASSIGN_OR_RETURN(d.name, GetString(dims[i], field, "name", true));
      ASSIGN_OR_RETURN(d.extent, GetInt64(dims[i], field, "extent"));
      if (dims[i].contains("min")) {
        ASSIGN_OR_RETURN(d.min, GetInt64(dims[i], field, "min"));
      }
      spec.dims.push_back(std::move(d));
    }
  }
  if (root.contains("inputs")) {
    const Json& inputs = root["inputs"];
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::string field = Item("inputs", i);
      RETURN_IF_ERROR(CheckKeys(inputs[i], field, {"name", "shape", "constant"}));
      TensorSpec t;
      t.where = Where{field, 0, 0};
      ASSIGN_OR_RETURN(t.name, GetString(inputs[i], field, "name", true));
      ASSIGN_OR_RETURN(t.shape, GetStringList(inputs[i], field, "shape", true));
      if (auto c = inputs[i].find("constant"); c != inputs[i].end()) {
        if (!c->is_boolean()) return FieldError(Sub(field, "constant"), "expected true or false");
        t.constant = c->get<bool>();
      }
      spec.inputs.push_back(std::move(t));
    }
  }
  if (root.contains("ops")) {
    const Json& ops = root["ops"];
    for (size_t i = 0; i < ops.size(); ++i) {
      std::string field = Item("ops", i);
      RETURN_IF_ERROR(
          CheckKeys(ops[i], field, {"output", "index", "kind", "reduce", "axis", "expr"}));
      OpSpec op;
      op.where = Where{field, 0, 0};
      op.expr_where = Where{Sub(field, "expr"), 0, 1};
      ASSIGN_OR_RETURN(op.output, GetString(ops[i], field, "output", true));
      ASSIGN_OR_RETURN(op.index, GetStringList(ops[i], field, "index", false));
      ASSIGN_OR_RETURN(std::string kind, GetString(ops[i], field, "kind", false));
      ASSIGN_OR_RETURN(op.kind, ParseOpKind(kind, Sub(field, "kind")));
      ASSIGN_OR_RETURN(op.reduce, GetStringList(ops[i], field, "reduce", false));
      ASSIGN_OR_RETURN(op.axis, GetString(ops[i], field, "axis", false));
      ASSIGN_OR_RETURN(op.expr, GetString(ops[i], field, "expr", true));
      spec.ops.push_back(std::move(op));
    }
  }
  ASSIGN_OR_RETURN(spec.outputs, GetStringList(root, "", "outputs", false));
  for (size_t i = 0; i < spec.outputs.size(); ++i) {
    spec.output_wheres.push_back(Where{Item("outputs", i), 0, 0});
  }
  return spec;
}

}  // namespace

absl::StatusOr<Chain> ParseChainJson(absl::string_view json, const Limits& limits) {
  if (json.size() > limits.max_spec_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("workload JSON is ", json.size(),
                                                   " bytes; the limit is ", limits.max_spec_bytes));
  }
  // A workload is a few levels deep: anything much deeper is refused before
  // the parser builds a tree that later walks recurse over.
  RETURN_IF_ERROR(CheckJsonDepth(json, "workload"));
  Json root = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    // Re-parse with exceptions only to get the position of the syntax error.
    try {
      Json reparsed = Json::parse(json);
    } catch (const Json::parse_error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("workload JSON is malformed at byte ", e.byte, ": ", e.what()));
    } catch (const Json::exception& e) {  // e.g. out_of_range: a number too large (found by fuzzing)
      return absl::InvalidArgumentError(absl::StrCat("workload JSON is malformed: ", e.what()));
    }
    return absl::InvalidArgumentError("workload JSON is malformed");
  }
  // A fusor.v1.Workload wraps either chain text or a chain.
  if (root.is_object() && (root.contains("text") || root.contains("chain"))) {
    RETURN_IF_ERROR(CheckKeys(root, "", {"text", "chain"}));
    if (root.contains("text") && root.contains("chain")) {
      return FieldError("workload", "give either text or chain, not both");
    }
    if (root.contains("text")) {
      if (!root["text"].is_string()) return FieldError("text", "expected a string");
      return ParseChainText(root["text"].get<std::string>(), limits);
    }
    root = root["chain"];
    if (!root.is_object()) return FieldError("chain", "expected an object");
  }
  ASSIGN_OR_RETURN(ChainSpec spec, SpecFromJson(root));
  return BuildChain(spec, limits);
}

std::string ChainToJson(const Chain& chain) {
  Json root;
  root["name"] = chain.name;
  root["dtype"] = std::string(DTypeName(chain.dtype));
  root["dims"] = Json::array();
  for (const Dim& d : chain.dims) {
    Json dim = {{"name", d.name}, {"extent", d.extent}};
    if (d.Ranged()) dim["min"] = d.min;
    root["dims"].push_back(dim);
  }
  root["inputs"] = Json::array();
  for (int t : chain.inputs) {
    const Tensor& tensor = chain.tensors[t];
    Json shape = Json::array();
    for (size_t a = 0; a < tensor.shape.size(); ++a) {
      int d = tensor.axis_dims[a];
      shape.push_back(d >= 0 ? chain.dims[d].name : absl::StrCat(tensor.shape[a]));
    }
    Json decl = {{"name", tensor.name}, {"shape", shape}};
    if (tensor.constant) decl["constant"] = true;
    root["inputs"].push_back(decl);
  }
  root["ops"] = Json::array();
  for (const Op& op : chain.ops) {
    Json o;
    o["output"] = chain.tensors[op.output].name;
    Json index = Json::array();
    for (int d : op.index) index.push_back(chain.dims[d].name);
    o["index"] = index;
    o["kind"] = std::string(OpKindName(op.kind));
    if (op.kind == OpKind::kSum) {
      Json reduce = Json::array();
      for (int d : op.reduce) reduce.push_back(chain.dims[d].name);
      o["reduce"] = reduce;
    }
    if (op.kind == OpKind::kSoftmax) o["axis"] = SoftmaxAxisText(op, chain);
    o["expr"] = ExprToString(op.body, chain);
    root["ops"].push_back(o);
  }
  root["outputs"] = Json::array();
  for (int t : chain.outputs) root["outputs"].push_back(chain.tensors[t].name);
  return root.dump();
}

}  // namespace fusor::ir
