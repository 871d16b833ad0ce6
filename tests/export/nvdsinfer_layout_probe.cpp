// Prints, one fact a line, what export/deepstream/nvdsinfer_custom_impl_dfine relies on in the
// nvdsinfer headers it is compiled against: each NvDsInferDataType value, the size and member
// offsets of the structs it reads and writes, and that its two entry points have the headers'
// signatures (a mismatch does not compile). Compiled against NVIDIA's DeepStream headers by
// scripts/record_deepstream_headers.py (facts recorded in tests/data/deepstream_headers.json) and
// against our transcription, tests/fakes/nvdsinfer, by tests/export/test_deepstream_lib.py.
#include <cstddef>
#include <cstdio>
#include <type_traits>
#include <vector>

#include "nvdsinfer_custom_impl.h"

extern "C" bool NvDsInferParseDfine(std::vector<NvDsInferLayerInfo> const &, NvDsInferNetworkInfo const &,
                                    NvDsInferParseDetectionParams const &,
                                    std::vector<NvDsInferObjectDetectionInfo> &);
[[maybe_unused]] static NvDsInferParseCustomFunc parserFits = NvDsInferParseDfine;
static_assert(std::is_same_v<decltype(&NvDsInferInitializeInputLayers),
                             bool (*)(std::vector<NvDsInferLayerInfo> const &, NvDsInferNetworkInfo const &,
                                      unsigned int)>,
              "NvDsInferInitializeInputLayers has another signature");

// NvDsInferParseDetectionParams holds std::vectors (not standard layout); g++ gives its offsets
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
#define ENUM(name) std::printf("enum %s %d\n", #name, static_cast<int>(name))
#define SIZE(type) std::printf("sizeof %s %zu\n", #type, sizeof(type))
#define MEMBER(type, member) std::printf("offsetof %s.%s %zu\n", #type, #member, offsetof(type, member))

int main() {
  ENUM(FLOAT);
  ENUM(HALF);
  ENUM(INT8);
  ENUM(INT32);
  ENUM(INT64);
  ENUM(UINT8);
  std::printf("NVDSINFER_MAX_DIMS %d\n", NVDSINFER_MAX_DIMS);
  SIZE(NvDsInferDataType);
  SIZE(NvDsInferDims);
  MEMBER(NvDsInferDims, numDims);
  MEMBER(NvDsInferDims, d);
  MEMBER(NvDsInferDims, numElements);
  SIZE(NvDsInferLayerInfo);
  MEMBER(NvDsInferLayerInfo, dataType);
  MEMBER(NvDsInferLayerInfo, inferDims);
  MEMBER(NvDsInferLayerInfo, bindingIndex);
  MEMBER(NvDsInferLayerInfo, layerName);
  MEMBER(NvDsInferLayerInfo, buffer);
  MEMBER(NvDsInferLayerInfo, isInput);
  SIZE(NvDsInferNetworkInfo);
  MEMBER(NvDsInferNetworkInfo, width);
  MEMBER(NvDsInferNetworkInfo, height);
  MEMBER(NvDsInferNetworkInfo, channels);
  SIZE(NvDsInferObjectDetectionInfo);
  MEMBER(NvDsInferObjectDetectionInfo, classId);
  MEMBER(NvDsInferObjectDetectionInfo, left);
  MEMBER(NvDsInferObjectDetectionInfo, top);
  MEMBER(NvDsInferObjectDetectionInfo, width);
  MEMBER(NvDsInferObjectDetectionInfo, height);
  MEMBER(NvDsInferObjectDetectionInfo, detectionConfidence);
  SIZE(NvDsInferParseDetectionParams);
  MEMBER(NvDsInferParseDetectionParams, numClassesConfigured);
  MEMBER(NvDsInferParseDetectionParams, perClassPreclusterThreshold);
  MEMBER(NvDsInferParseDetectionParams, perClassPostclusterThreshold);
  return 0;
}
