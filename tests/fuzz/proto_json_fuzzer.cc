// libFuzzer target: the JSON front ends — fusor's own reader of
// fusor.v1.Chain/Workload JSON, and protobuf's JSON into a Workload
// followed by the wire conversion the scheduler applies to every request.
#include <google/protobuf/util/json_util.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/ir/canonical.h"
#include "common/ir/parse.h"
#include "proto/wire/convert.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  auto chain = fusor::ir::ParseChainJson(json);
  if (chain.ok()) (void)fusor::ir::Canonicalize(*chain);
  fusor::v1::Workload workload;
  if (google::protobuf::util::JsonStringToMessage(json, &workload).ok()) {
    auto converted = fusor::wire::ChainFromWorkload(workload);
    if (converted.ok()) (void)fusor::wire::ChainToProto(*converted);
  }
  return 0;
}
