// libFuzzer target: the ONNX importer on arbitrary bytes (written to a file,
// as the importer reads files), with the dims the seeds use bound.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/zoo/onnx_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/fusor-onnx-fuzz-" + std::to_string(getpid()) + ".onnx";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  (void)fusor::zoo::ExtractOnnx(path, {{"batch", 2}, {"seq", 8}, {"n", 1}, {"N", 1}, {"tokens", 4}});
  return 0;
}
