#include "proto/wire/convert.h"

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "common/ir/parse.h"

namespace fusor::wire {

absl::StatusOr<ir::Chain> ChainFromWorkload(const v1::Workload& workload, const ir::Limits& limits) {
  switch (workload.source_case()) {
    case v1::Workload::kText: return ir::ParseChainText(workload.text(), limits);
    case v1::Workload::kChain: break;
    default: return absl::InvalidArgumentError("workload: give either text or chain");
  }
  const v1::Chain& c = workload.chain();
  if (c.ByteSizeLong() > limits.max_spec_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("workload chain is ", c.ByteSizeLong(),
                                                   " bytes; the limit is ", limits.max_spec_bytes));
  }
  ir::ChainSpec spec;
  spec.where = ir::Where{"chain", 0, 0};
  spec.name = c.name();
  switch (c.dtype()) {
    case v1::DTYPE_F32: spec.dtype = ir::DType::kF32; break;
    case v1::DTYPE_F16: spec.dtype = ir::DType::kF16; break;
    case v1::DTYPE_BF16: spec.dtype = ir::DType::kBF16; break;
    default: break;
  }
  for (int i = 0; i < c.dims_size(); ++i) {
    spec.dims.push_back({c.dims(i).name(), c.dims(i).extent(), c.dims(i).min(),
                         ir::Where{absl::StrCat("chain.dims[", i, "]"), 0, 0}});
  }
  for (int i = 0; i < c.inputs_size(); ++i) {
    ir::TensorSpec t;
    t.name = c.inputs(i).name();
    t.shape.assign(c.inputs(i).shape().begin(), c.inputs(i).shape().end());
    t.constant = c.inputs(i).constant();
    t.where = ir::Where{absl::StrCat("chain.inputs[", i, "]"), 0, 0};
    spec.inputs.push_back(std::move(t));
  }
  for (int i = 0; i < c.ops_size(); ++i) {
    const v1::Op& o = c.ops(i);
    ir::OpSpec op;
    op.output = o.output();
    op.index.assign(o.index().begin(), o.index().end());
    switch (o.kind()) {
      case v1::OP_KIND_SUM: op.kind = ir::OpKind::kSum; break;
      case v1::OP_KIND_SOFTMAX: op.kind = ir::OpKind::kSoftmax; break;
      default: op.kind = ir::OpKind::kMap; break;
    }
    op.reduce.assign(o.reduce().begin(), o.reduce().end());
    op.axis = o.axis();
    op.expr = o.expr();
    op.where = ir::Where{absl::StrCat("chain.ops[", i, "]"), 0, 0};
    op.expr_where = ir::Where{absl::StrCat("chain.ops[", i, "].expr"), 0, 1};
    spec.ops.push_back(std::move(op));
  }
  for (int i = 0; i < c.outputs_size(); ++i) {
    spec.outputs.push_back(c.outputs(i));
    spec.output_wheres.push_back(ir::Where{absl::StrCat("chain.outputs[", i, "]"), 0, 0});
  }
  return ir::BuildChain(spec, limits);
}

v1::Chain ChainToProto(const ir::Chain& chain) {
  v1::Chain c;
  c.set_name(chain.name);
  c.set_dtype(chain.dtype == ir::DType::kF32   ? v1::DTYPE_F32
              : chain.dtype == ir::DType::kF16 ? v1::DTYPE_F16
                                               : v1::DTYPE_BF16);
  for (const ir::Dim& d : chain.dims) {
    v1::Dim* pd = c.add_dims();
    pd->set_name(d.name);
    pd->set_extent(d.extent);
    pd->set_min(d.min);
  }
  for (int t : chain.inputs) {
    const ir::Tensor& tensor = chain.tensors[t];
    v1::TensorDecl* decl = c.add_inputs();
    decl->set_name(tensor.name);
    decl->set_constant(tensor.constant);
    for (size_t a = 0; a < tensor.shape.size(); ++a) {
      int d = tensor.axis_dims[a];
      decl->add_shape(d >= 0 ? chain.dims[d].name : absl::StrCat(tensor.shape[a]));
    }
  }
  for (const ir::Op& op : chain.ops) {
    v1::Op* po = c.add_ops();
    po->set_output(chain.tensors[op.output].name);
    for (int d : op.index) po->add_index(chain.dims[d].name);
    po->set_kind(op.kind == ir::OpKind::kSum       ? v1::OP_KIND_SUM
                 : op.kind == ir::OpKind::kSoftmax ? v1::OP_KIND_SOFTMAX
                                                   : v1::OP_KIND_MAP);
    for (int d : op.reduce) po->add_reduce(chain.dims[d].name);
    if (op.axis >= 0) po->set_axis(ir::SoftmaxAxisText(op, chain));
    po->set_expr(ir::ExprToString(op.body, chain));
  }
  for (int t : chain.outputs) c.add_outputs(chain.tensors[t].name);
  return c;
}

hw::TargetDesc TargetFromProto(const v1::Target& p) {
  hw::TargetDesc t;
  t.backend = p.backend() == v1::BACKEND_CUDA ? hw::Backend::kCuda : hw::Backend::kCpu;
  t.arch = p.arch();
  t.device_name = p.device_name();
  t.compute_units = p.compute_units();
  t.vector_lanes_f32 = p.vector_lanes_f32();
  t.isa_features.assign(p.isa_features().begin(), p.isa_features().end());
  t.l1d_bytes = p.l1d_bytes();
  t.l2_bytes = p.l2_bytes();
  t.l3_bytes = p.l3_bytes();
  t.shared_mem_per_block = p.shared_mem_per_block();
  t.compiler = p.compiler();
  t.bandwidth_bytes_per_s = p.bandwidth_bytes_per_s();
  t.peak_flops = p.peak_flops();
  return t;
}

v1::Target TargetToProto(const hw::TargetDesc& t) {
  v1::Target p;
  p.set_backend(t.backend == hw::Backend::kCuda ? v1::BACKEND_CUDA : v1::BACKEND_CPU);
  p.set_arch(t.arch);
  p.set_device_name(t.device_name);
  p.set_compute_units(t.compute_units);
  p.set_vector_lanes_f32(t.vector_lanes_f32);
  for (const std::string& f : t.isa_features) p.add_isa_features(f);
  p.set_l1d_bytes(t.l1d_bytes);
  p.set_l2_bytes(t.l2_bytes);
  p.set_l3_bytes(t.l3_bytes);
  p.set_shared_mem_per_block(t.shared_mem_per_block);
  p.set_compiler(t.compiler);
  p.set_bandwidth_bytes_per_s(t.bandwidth_bytes_per_s);
  p.set_peak_flops(t.peak_flops);
  p.set_fingerprint(hw::TargetFingerprint(t));
  return p;
}

absl::StatusOr<std::string> TargetToJson(const hw::TargetDesc& target) {
  google::protobuf::util::JsonPrintOptions print;
  print.always_print_primitive_fields = true;
  std::string json;
  const auto printed = google::protobuf::util::MessageToJsonString(TargetToProto(target), &json, print);
  if (!printed.ok()) {
    return absl::InternalError(absl::StrCat("cannot write the target description: ", printed.message().as_string()));
  }
  return json;
}

absl::StatusOr<hw::TargetDesc> TargetFromJson(const std::string& json) {
  v1::Target proto;
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, &proto);
  if (!parsed.ok()) {
    return absl::DataLossError(absl::StrCat("unreadable target description: ", parsed.message().as_string()));
  }
  return TargetFromProto(proto);
}

std::string BackendName(v1::Backend backend) {
  switch (backend) {
    case v1::BACKEND_CPU: return "cpu";
    case v1::BACKEND_CUDA: return "cuda";
    default: return "unspecified";
  }
}

std::string MeasurementStatusName(v1::MeasurementStatus status) {
  switch (status) {
    case v1::MEASUREMENT_STATUS_OK: return "ok";
    case v1::MEASUREMENT_STATUS_COMPILE_ERROR: return "compile_error";
    case v1::MEASUREMENT_STATUS_INVALID_RESULT: return "invalid_result";
    case v1::MEASUREMENT_STATUS_TIMEOUT: return "timeout";
    case v1::MEASUREMENT_STATUS_CRASH: return "crash";
    case v1::MEASUREMENT_STATUS_RUNTIME_ERROR: return "runtime_error";
    case v1::MEASUREMENT_STATUS_NOISY: return "noisy";
    default: return "unspecified";
  }
}

}  // namespace fusor::wire
