// libFuzzer target: the chain text front end. Any input either fails with a
// status or parses to a chain whose printed text and JSON parse back to the
// same canonical key.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>

#include "common/ir/canonical.h"
#include "common/ir/parse.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto chain = fusor::ir::ParseChainText(text);
  if (!chain.ok()) return 0;
  const std::string key = fusor::ir::Canonicalize(*chain).key;
  const std::string printed = fusor::ir::ChainToText(*chain);
  auto again = fusor::ir::ParseChainText(printed);
  auto from_json = fusor::ir::ParseChainJson(fusor::ir::ChainToJson(*chain));
  if (!again.ok() || !from_json.ok() || fusor::ir::Canonicalize(*again).key != key ||
      fusor::ir::Canonicalize(*from_json).key != key) {
    std::fprintf(stderr, "round trip changed the chain:\n%s\n", printed.c_str());
    std::abort();
  }
  return 0;
}
