// nvinfer custom library for D-FINE graphs exported by dfine-export (export/deepstream/README.md).
//
// NvDsInferInitializeInputLayers: fills the graph's second input, orig_target_sizes [N, 2] = (w, h),
//   with the network size for every batch slot, in INT32 (TensorRT 8.x engines, --target trt8.5 /
//   trt8.6) or INT64 (TensorRT 10.x / 11.x engines). Boxes then come out in network pixels, which
//   nvinfer maps back to the frame. Any other data type is refused in one line, never reinterpreted.
// NvDsInferParseDfine (parse-bbox-func-name): finds `labels`, `boxes` (xyxy) and `scores` by name,
//   never by index, and emits every detection whose score reaches its class's pre-cluster threshold.
//   D-FINE is NMS-free: the config sets cluster-mode=4.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "nvdsinfer_custom_impl.h"

namespace {

// NvDsInferDataType gained INT64 (and UINT8) after DeepStream 6.x, whose enum stops at INT32 (the
// 9.0 and 9.1 nvdsinfer.h in NVIDIA's DeepStream SDK API Reference list FLOAT, HALF, INT8, INT32,
// INT64, UINT8). The Makefile defines DFINE_NVDSINFER_HAS_INT64 when the headers it builds against
// declare INT64; the library then names it, and without it refuses INT64 tensors as any other type
// (a DeepStream without INT64 cannot hand one over).
#ifdef DFINE_NVDSINFER_HAS_INT64
bool isInt64(NvDsInferDataType type) { return type == INT64; }
constexpr const char *kIndexTypes = "INT32 or INT64";
#else
bool isInt64(NvDsInferDataType) { return false; }
constexpr const char *kIndexTypes = "INT32 (the DeepStream headers this library was built with have no INT64)";
#endif

const NvDsInferLayerInfo *findLayer(std::vector<NvDsInferLayerInfo> const &layers, const char *name) {
  for (auto const &layer : layers) {
    if (layer.layerName != nullptr && std::strcmp(layer.layerName, name) == 0) return &layer;
  }
  return nullptr;
}

// The label of detection k in the engine's integer width (INT32 on 8.x, INT64 on 10.x+); the
// caller has checked that the type is one of the two (isIndexType).
long long labelAt(NvDsInferLayerInfo const &labels, unsigned int k) {
  if (isInt64(labels.dataType)) return static_cast<const int64_t *>(labels.buffer)[k];
  return static_cast<const int32_t *>(labels.buffer)[k];
}

bool isIndexType(NvDsInferDataType type) { return type == INT32 || isInt64(type); }

}  // namespace

extern "C" bool NvDsInferInitializeInputLayers(std::vector<NvDsInferLayerInfo> const &inputLayersInfo,
                                               NvDsInferNetworkInfo const &networkInfo,
                                               unsigned int maxBatchSize) {
  const NvDsInferLayerInfo *sizes = findLayer(inputLayersInfo, "orig_target_sizes");
  if (sizes == nullptr || sizes->buffer == nullptr) {
    std::fprintf(stderr, "nvdsinfer_custom_impl_dfine: the engine has no input 'orig_target_sizes'; "
                         "is it a dfine-export graph with the postprocessor?\n");
    return false;
  }
  for (unsigned int b = 0; b < maxBatchSize; ++b) {
    if (isInt64(sizes->dataType)) {
      auto *out = static_cast<int64_t *>(sizes->buffer) + 2 * b;
      out[0] = networkInfo.width;
      out[1] = networkInfo.height;
    } else if (sizes->dataType == INT32) {
      auto *out = static_cast<int32_t *>(sizes->buffer) + 2 * b;
      out[0] = static_cast<int32_t>(networkInfo.width);
      out[1] = static_cast<int32_t>(networkInfo.height);
    } else {
      std::fprintf(stderr, "nvdsinfer_custom_impl_dfine: 'orig_target_sizes' has NvDsInferDataType %d, "
                           "expected %s\n", static_cast<int>(sizes->dataType), kIndexTypes);
      return false;
    }
  }
  return true;
}

extern "C" bool NvDsInferParseDfine(std::vector<NvDsInferLayerInfo> const &outputLayersInfo,
                                    NvDsInferNetworkInfo const &networkInfo,
                                    NvDsInferParseDetectionParams const &detectionParams,
                                    std::vector<NvDsInferObjectDetectionInfo> &objectList) {
  const NvDsInferLayerInfo *labels = findLayer(outputLayersInfo, "labels");
  const NvDsInferLayerInfo *boxes = findLayer(outputLayersInfo, "boxes");
  const NvDsInferLayerInfo *scores = findLayer(outputLayersInfo, "scores");
  if (labels == nullptr || boxes == nullptr || scores == nullptr) {
    std::fprintf(stderr, "nvdsinfer_custom_impl_dfine: outputs 'labels', 'boxes', 'scores' not all "
                         "found; set output-blob-names=labels;boxes;scores\n");
    return false;
  }
  if (boxes->dataType != FLOAT || scores->dataType != FLOAT) {
    std::fprintf(stderr, "nvdsinfer_custom_impl_dfine: 'boxes' and 'scores' must be FLOAT\n");
    return false;
  }
  if (!isIndexType(labels->dataType)) {
    std::fprintf(stderr, "nvdsinfer_custom_impl_dfine: 'labels' has NvDsInferDataType %d, expected %s; "
                         "build the engine from a dfine-export graph (export/jetson/build_engine.sh)\n",
                 static_cast<int>(labels->dataType), kIndexTypes);
    return false;
  }
  const unsigned int count = scores->inferDims.numElements;
  if (boxes->inferDims.numElements != 4 * count || labels->inferDims.numElements != count) {
    std::fprintf(stderr, "nvdsinfer_custom_impl_dfine: expected labels [K], boxes [K, 4], scores [K]\n");
    return false;
  }
  const auto *box = static_cast<const float *>(boxes->buffer);
  const auto *score = static_cast<const float *>(scores->buffer);
  const float width = static_cast<float>(networkInfo.width);
  const float height = static_cast<float>(networkInfo.height);
  auto const &thresholds = detectionParams.perClassPreclusterThreshold;
  for (unsigned int k = 0; k < count; ++k) {
    const long long label = labelAt(*labels, k);
    if (label < 0 || static_cast<unsigned long long>(label) >= detectionParams.numClassesConfigured ||
        static_cast<unsigned long long>(label) >= thresholds.size()) {
      continue;  // a class the config does not know (num-detected-classes)
    }
    if (score[k] < thresholds[label]) continue;
    const float x1 = std::clamp(box[4 * k + 0], 0.0f, width);
    const float y1 = std::clamp(box[4 * k + 1], 0.0f, height);
    const float x2 = std::clamp(box[4 * k + 2], 0.0f, width);
    const float y2 = std::clamp(box[4 * k + 3], 0.0f, height);
    if (x2 <= x1 || y2 <= y1) continue;
    NvDsInferObjectDetectionInfo object{};
    object.classId = static_cast<unsigned int>(label);
    object.left = x1;
    object.top = y1;
    object.width = x2 - x1;
    object.height = y2 - y1;
    object.detectionConfidence = score[k];
    objectList.push_back(object);
  }
  return true;
}

CHECK_CUSTOM_PARSE_FUNC_PROTOTYPE(NvDsInferParseDfine);
