// Folding of shape computations: what an exporter writes to compute a
// Reshape's target, position ids and a scale, evaluated once the input's
// shape is known; what depends on tensor data is left alone.
#include "common/zoo/onnx_fold.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace fusor::zoo {
namespace {

using ::testing::ElementsAre;

class FoldTest : public ::testing::Test {
 protected:
  FoldTest() {
    onnx::ValueInfoProto* x = g_.add_input();
    x->set_name("x");
    auto* t = x->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : {2, 3, 4}) t->mutable_shape()->add_dim()->set_dim_value(d);
  }
  void Ints(const std::string& out, std::vector<int64_t> v, bool scalar = false) {
    onnx::TensorProto t;
    t.set_data_type(onnx::TensorProto::INT64);
    if (!scalar) t.add_dims(static_cast<int64_t>(v.size()));
    for (int64_t x : v) t.add_int64_data(x);
    Constant(out, t);
  }
  void Float(const std::string& out, float v) {
    onnx::TensorProto t;
    t.set_data_type(onnx::TensorProto::FLOAT);
    t.add_float_data(v);
    Constant(out, t);
  }
  void Constant(const std::string& out, const onnx::TensorProto& t) {
    onnx::NodeProto* n = Node("Constant", {}, out);
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    *a->mutable_t() = t;
  }
  onnx::NodeProto* Node(const std::string& op, std::vector<std::string> in, const std::string& out) {
    onnx::NodeProto* n = g_.add_node();
    n->set_op_type(op);
    n->set_name(out + "_node");
    for (const std::string& i : in) n->add_input(i);
    n->add_output(out);
    return n;
  }
  void IntAttr(onnx::NodeProto* n, const std::string& name, int64_t v) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  // The node producing `out`.
  const onnx::NodeProto& Producer(const std::string& out) const {
    for (const onnx::NodeProto& n : g_.node()) {
      if (n.output(0) == out) return n;
    }
    ADD_FAILURE() << "no node makes " << out;
    return g_.node(0);
  }
  // The folded value of `out` (its dims, then its elements as doubles).
  std::pair<std::vector<int64_t>, std::vector<double>> Folded(const std::string& out) const {
    const onnx::NodeProto& n = Producer(out);
    EXPECT_EQ(n.op_type(), "Constant") << out;
    if (n.op_type() != "Constant") return {};
    const onnx::TensorProto& t = n.attribute(0).t();
    std::vector<double> v(t.int64_data().begin(), t.int64_data().end());
    v.insert(v.end(), t.float_data().begin(), t.float_data().end());
    v.insert(v.end(), t.int32_data().begin(), t.int32_data().end());
    return {{t.dims().begin(), t.dims().end()}, v};
  }

  onnx::GraphProto g_;
};

TEST_F(FoldTest, ShapeSubgraphsFoldAndDataStays) {
  // Reshape(x, Concat(-1, Unsqueeze(Gather(Shape(x), 1), 0))): x to [-1, 3].
  Node("Shape", {"x"}, "s");
  Ints("one", {1}, /*scalar=*/true);
  Node("Gather", {"s", "one"}, "g");
  Ints("axis0", {0});
  Node("Unsqueeze", {"g", "axis0"}, "u");
  Ints("minus1", {-1});
  IntAttr(Node("Concat", {"minus1", "u"}, "target"), "axis", 0);
  Node("Reshape", {"x", "target"}, "r");
  // Slice(Shape(x), 1, INT64_MAX): the trailing dims.
  Ints("start", {1});
  Ints("end", {std::numeric_limits<int64_t>::max()});
  Node("Slice", {"s", "start", "end"}, "tail");
  // Range(0, dim, 1) and a mask of it: position ids.
  Ints("zero", {0}, true);
  Node("Range", {"zero", "g", "one"}, "ids");
  Node("Equal", {"ids", "one"}, "is1");
  Node("Where", {"is1", "zero", "ids"}, "masked");
  // Expand(Unsqueeze(ids, 1), [3, 2]), ConstantOfShape, Tile.
  Ints("axis1", {1});
  Node("Unsqueeze", {"ids", "axis1"}, "col");
  Ints("shape32", {3, 2});
  Node("Expand", {"col", "shape32"}, "expanded");
  Node("ConstantOfShape", {"tail"}, "zeros");
  Ints("twice", {2});
  Node("Tile", {"ids", "twice"}, "tiled");
  // 1 / sqrt(float(dim)): a scale; 1 / 0 is not baked in.
  IntAttr(Node("Cast", {"g"}, "gf"), "to", onnx::TensorProto::FLOAT);
  Node("Sqrt", {"gf"}, "root");
  Float("f1", 1);
  Node("Div", {"f1", "root"}, "scale");
  Float("f0", 0);
  Node("Div", {"f1", "f0"}, "inf");

  EXPECT_EQ(FoldShapeComputations(g_, 13), 15);  // all but the Reshape and the division by zero
  EXPECT_EQ(Folded("s").second, (std::vector<double>{2, 3, 4}));
  EXPECT_TRUE(Folded("g").first.empty());  // a scalar
  EXPECT_EQ(Folded("g").second, (std::vector<double>{3}));
  EXPECT_EQ(Folded("target").second, (std::vector<double>{-1, 3}));
  EXPECT_EQ(Producer("r").op_type(), "Reshape");  // x's values are not known
  EXPECT_EQ(Folded("tail").second, (std::vector<double>{3, 4}));
  EXPECT_EQ(Folded("ids").second, (std::vector<double>{0, 1, 2}));
  EXPECT_EQ(Folded("masked").second, (std::vector<double>{0, 0, 2}));
  EXPECT_THAT(Folded("expanded").first, ElementsAre(3, 2));
  EXPECT_EQ(Folded("expanded").second, (std::vector<double>{0, 0, 1, 1, 2, 2}));
  EXPECT_THAT(Folded("zeros").first, ElementsAre(3, 4));
  EXPECT_EQ(Folded("zeros").second, std::vector<double>(12, 0.0));
  EXPECT_EQ(Folded("tiled").second, (std::vector<double>{0, 1, 2, 0, 1, 2}));
  ASSERT_EQ(Folded("scale").second.size(), 1u);
  EXPECT_NEAR(Folded("scale").second[0], 0.57735, 1e-5);
  EXPECT_EQ(Producer("inf").op_type(), "Div");
  EXPECT_EQ(FoldShapeComputations(g_, 13), 0);  // nothing left to fold
}

TEST_F(FoldTest, UnknownDimsAndLargeTensorsStay) {
  onnx::ValueInfoProto* y = g_.add_input();
  y->set_name("y");
  auto* t = y->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  t->mutable_shape()->add_dim()->set_dim_param("seq");  // unbound
  Node("Shape", {"y"}, "sy");
  Ints("big", {1024, 1024});
  Node("ConstantOfShape", {"big"}, "ones");  // 2^20 elements: over the limit
  EXPECT_EQ(FoldShapeComputations(g_, 13), 0);
  EXPECT_EQ(Producer("sy").op_type(), "Shape");
  EXPECT_EQ(Producer("ones").op_type(), "ConstantOfShape");
}

// What causal masks are built with: Flatten, GatherND (with and without
// batch dims), Trilu, and 16-bit floats, on x = 0..23 as [2, 3, 4].
TEST_F(FoldTest, MaskOpsFold) {
  std::vector<int64_t> counting(24);
  for (int64_t i = 0; i < 24; ++i) counting[i] = i;
  Ints("flat", counting);
  Ints("shape234", {2, 3, 4});
  Node("Reshape", {"flat", "shape234"}, "v");
  IntAttr(Node("Flatten", {"v"}, "flat2"), "axis", 2);
  // v[1, 2, :] and v[0, 1, :].
  Ints("pairs", {1, 2, 0, 1});
  Ints("shape22", {2, 2});
  Node("Reshape", {"pairs", "shape22"}, "idx");
  Node("GatherND", {"v", "idx"}, "rows");
  // Batch dim 0 shared: v[0, 2, :] and v[1, 0, :].
  Ints("singles", {2, 0});
  Ints("shape21", {2, 1});
  Node("Reshape", {"singles", "shape21"}, "idx1");
  IntAttr(Node("GatherND", {"v", "idx1"}, "batched"), "batch_dims", 1);
  // The lower triangle of each [3, 4] matrix, and the upper one from k = 1.
  IntAttr(Node("Trilu", {"v"}, "lower"), "upper", 0);
  Ints("k1", {1}, /*scalar=*/true);
  Node("Trilu", {"v", "k1"}, "upper");
  // f16 1.5 and -2 (raw bits 0x3e00, 0xc000) cast to f32.
  onnx::TensorProto half;
  half.set_data_type(onnx::TensorProto::FLOAT16);
  half.add_dims(2);
  half.set_raw_data(std::string{'\x00', '\x3e', '\x00', '\xc0'});
  Constant("h", half);
  IntAttr(Node("Cast", {"h"}, "hf"), "to", onnx::TensorProto::FLOAT);

  FoldShapeComputations(g_, 14);
  EXPECT_THAT(Folded("flat2").first, ElementsAre(6, 4));
  EXPECT_EQ(Folded("rows").second, (std::vector<double>{20, 21, 22, 23, 4, 5, 6, 7}));
  EXPECT_THAT(Folded("batched").first, ElementsAre(2, 4));
  EXPECT_EQ(Folded("batched").second, (std::vector<double>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(Folded("lower").second, (std::vector<double>{0, 0, 0, 0, 4, 5, 0, 0, 8, 9, 10, 0,  //
                                                         12, 0, 0, 0, 16, 17, 0, 0, 20, 21, 22, 0}));
  EXPECT_EQ(Folded("upper").second, (std::vector<double>{0, 1, 2, 3, 0, 0, 6, 7, 0, 0, 0, 11,  //
                                                         0, 13, 14, 15, 0, 0, 18, 19, 0, 0, 0, 23}));
  EXPECT_EQ(Folded("hf").second, (std::vector<double>{1.5, -2}));
}

// EvaluateConstant keeps infinities (a mask's fill) that folding leaves to
// the runtime, and reads nothing it cannot compute.
TEST_F(FoldTest, EvaluateConstantKeepsInfinities) {
  Ints("shape", {2, 2});
  Node("ConstantOfShape", {"shape"}, "zeros");
  Float("zero", 0);
  Node("Equal", {"zeros", "zero"}, "all");
  Float("minus_inf", -std::numeric_limits<float>::infinity());
  Node("Where", {"all", "minus_inf", "zero"}, "mask");
  auto mask = EvaluateConstant(g_, 13, "mask", 1 << 10);
  ASSERT_TRUE(mask.has_value());
  EXPECT_THAT(mask->dims, ElementsAre(2, 2));
  EXPECT_EQ(mask->values, std::vector<double>(4, -std::numeric_limits<double>::infinity()));
  EXPECT_FALSE(EvaluateConstant(g_, 13, "x", 1 << 10).has_value());  // an input without a value
  FoldShapeComputations(g_, 13);
  EXPECT_EQ(Producer("mask").op_type(), "Where");
}

}  // namespace
}  // namespace fusor::zoo
