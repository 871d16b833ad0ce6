// Drives the nvdsinfer custom library the way nvinfer calls it (tests/export/test_deepstream_lib.py):
// orig_target_sizes in INT32 and INT64, one frame of labels/boxes/scores with INT32 and INT64
// labels, and labels of other types. Prints what came back; the test reads it.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "nvdsinfer_custom_impl.h"

extern "C" bool NvDsInferParseDfine(std::vector<NvDsInferLayerInfo> const &, NvDsInferNetworkInfo const &,
                                    NvDsInferParseDetectionParams const &,
                                    std::vector<NvDsInferObjectDetectionInfo> &);

static NvDsInferLayerInfo layer(const char *name, NvDsInferDataType type, unsigned int elements, void *buffer) {
  NvDsInferLayerInfo info{};
  info.dataType = type;
  info.inferDims.numDims = 1;
  info.inferDims.d[0] = elements;
  info.inferDims.numElements = elements;
  info.layerName = name;
  info.buffer = buffer;
  return info;
}

int main() {
  NvDsInferNetworkInfo network{640, 480, 3};
  int32_t sizes32[3 * 2] = {};
  int64_t sizes64[3 * 2] = {};
  bool ok32 = NvDsInferInitializeInputLayers({layer("orig_target_sizes", INT32, 2, sizes32)}, network, 3);
  bool ok64 = NvDsInferInitializeInputLayers({layer("orig_target_sizes", INT64, 2, sizes64)}, network, 3);
  std::printf("init int32 %d %d %d %d %d\n", ok32, sizes32[0], sizes32[1], sizes32[4], sizes32[5]);
  std::printf("init int64 %d %lld %lld %lld %lld\n", ok64, (long long)sizes64[0], (long long)sizes64[1],
              (long long)sizes64[4], (long long)sizes64[5]);
  float wrong[2] = {};
  std::printf("init float %d\n", NvDsInferInitializeInputLayers({layer("orig_target_sizes", FLOAT, 2, wrong)},
                                                                 network, 1));
  std::printf("init missing %d\n", NvDsInferInitializeInputLayers({layer("images", FLOAT, 2, wrong)}, network, 1));

  // K = 4 detections: a kept one, one below its class threshold, one of an unknown class, one
  // partly outside the network input (clipped).
  float boxes[4 * 4] = {10, 20, 110, 220, 0, 0, 50, 50, 5, 5, 15, 15, -10, 400, 700, 520};
  float scores[4] = {0.9f, 0.2f, 0.95f, 0.6f};
  int32_t labels32[4] = {1, 0, 7, 2};
  int64_t labels64[4] = {1, 0, 7, 2};
  NvDsInferParseDetectionParams params{};
  params.numClassesConfigured = 3;
  params.perClassPreclusterThreshold = {0.3f, 0.5f, 0.5f};
  for (int wide = 0; wide < 2; ++wide) {
    // output order differs from the graph's: layers are found by name
    std::vector<NvDsInferLayerInfo> outputs = {
        layer("scores", FLOAT, 4, scores), layer("boxes", FLOAT, 16, boxes),
        wide ? layer("labels", INT64, 4, labels64) : layer("labels", INT32, 4, labels32)};
    std::vector<NvDsInferObjectDetectionInfo> objects;
    bool ok = NvDsInferParseDfine(outputs, network, params, objects);
    std::printf("parse %s %d %zu", wide ? "int64" : "int32", ok, objects.size());
    for (auto const &o : objects) {
      std::printf(" [%u %.1f %.1f %.1f %.1f %.2f]", o.classId, o.left, o.top, o.width, o.height,
                  o.detectionConfidence);
    }
    std::printf("\n");
  }
  std::vector<NvDsInferObjectDetectionInfo> none;
  std::printf("parse missing %d\n", NvDsInferParseDfine({layer("scores", FLOAT, 4, scores)}, network, params, none));
  // labels of a type that is not an index type: refused, never read as floats or bytes
  float labelsFloat[4] = {1, 0, 7, 2};
  uint8_t labelsBytes[4] = {1, 0, 7, 2};
  std::vector<NvDsInferLayerInfo> floats = {layer("scores", FLOAT, 4, scores), layer("boxes", FLOAT, 16, boxes),
                                            layer("labels", FLOAT, 4, labelsFloat)};
  std::vector<NvDsInferLayerInfo> bytes = {layer("scores", FLOAT, 4, scores), layer("boxes", FLOAT, 16, boxes),
                                           layer("labels", UINT8, 4, labelsBytes)};
  int okFloat = NvDsInferParseDfine(floats, network, params, none);
  std::printf("parse float-labels %d %zu\n", okFloat, none.size());
  int okBytes = NvDsInferParseDfine(bytes, network, params, none);
  std::printf("parse uint8-labels %d %zu\n", okBytes, none.size());
  return 0;
}
