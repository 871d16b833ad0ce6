/*
 * OUR OWN MINIMAL DECLARATION HEADER, NOT NVIDIA'S FILE.
 *
 * It declares only what export/deepstream/nvdsinfer_custom_impl_dfine uses, transcribed (names,
 * member order, types, function signatures) from NVIDIA's documented DeepStream nvdsinfer API:
 * nvdsinfer.h and nvdsinfer_custom_impl.h as shown in the DeepStream SDK API Reference
 * (https://docs.nvidia.com/metropolis/deepstream/dev-guide/sdk-api/). It exists so that CI, which
 * has no DeepStream install, can compile the custom library and check its syntax and types
 * (tests/export/test_deepstream_lib.py). On a DeepStream machine the Makefile uses the install's own
 * headers (/opt/nvidia/deepstream/deepstream/sources/includes) instead.
 *
 * Not transcribed: TensorRT types (nvinfer1::*), engine-creation and classifier/segmentation
 * parser declarations, deprecated members. NvDsInferDataType lists the members of the DeepStream
 * 9.0 and 9.1 nvdsinfer.h (FLOAT 0, HALF 1, INT8 2, INT32 3, INT64 4, UINT8 5:
 * https://docs.nvidia.com/metropolis/deepstream/9.1/sdk-api/sources_2includes_2nvdsinfer_8h_source.html);
 * the 6.x headers stop at INT32 (https://docs.nvidia.com/metropolis/deepstream/6.0/sdk-api/globals_eval_i.html
 * lists INT8 and INT32 only). The library's Makefile finds INT64 in the headers or builds without it.
 * Checked against NVIDIA's own 9.0.0 and 9.1.0 headers (github.com/NVIDIA/DeepStream): the enum
 * values, struct sizes and member offsets recorded in tests/data/deepstream_headers.json by
 * scripts/record_deepstream_headers.py must be this header's (tests/export/test_deepstream_lib.py).
 */
#ifndef DFINE_CI_NVDSINFER_CUSTOM_IMPL_H
#define DFINE_CI_NVDSINFER_CUSTOM_IMPL_H

#include <string>
#include <vector>

extern "C" {

#define NVDSINFER_MAX_DIMS 8

typedef struct {
  unsigned int numDims;
  unsigned int d[NVDSINFER_MAX_DIMS];
  unsigned int numElements;
} NvDsInferDims;

typedef enum {
  FLOAT = 0,
  HALF = 1,
  INT8 = 2,
  INT32 = 3,
  INT64 = 4,
  UINT8 = 5
} NvDsInferDataType;

typedef struct {
  NvDsInferDataType dataType;
  NvDsInferDims inferDims;
  int bindingIndex;
  const char *layerName;
  void *buffer;
  int isInput;
} NvDsInferLayerInfo;

typedef struct {
  unsigned int width;
  unsigned int height;
  unsigned int channels;
} NvDsInferNetworkInfo;

typedef struct {
  unsigned int classId;
  float left;
  float top;
  float width;
  float height;
  float detectionConfidence;
  float rotation_angle; /* 9.0 and 9.1: an oriented box's angle; 0 for an axis-aligned one */
} NvDsInferObjectDetectionInfo;

}  // extern "C"

typedef struct {
  unsigned int numClassesConfigured;
  std::vector<float> perClassPreclusterThreshold;
  std::vector<float> perClassPostclusterThreshold;
  std::vector<float> &perClassThreshold = perClassPreclusterThreshold; /* deprecated alias, kept for layout */
} NvDsInferParseDetectionParams;

typedef bool (*NvDsInferParseCustomFunc)(std::vector<NvDsInferLayerInfo> const &outputLayersInfo,
                                         NvDsInferNetworkInfo const &networkInfo,
                                         NvDsInferParseDetectionParams const &detectionParams,
                                         std::vector<NvDsInferObjectDetectionInfo> &objectList);

/* Fails the build when a parser's signature differs from NvDsInferParseCustomFunc. */
#define CHECK_CUSTOM_PARSE_FUNC_PROTOTYPE(customParseFunc) \
  [[maybe_unused]] static NvDsInferParseCustomFunc checkFunc_##customParseFunc = customParseFunc

extern "C" bool NvDsInferInitializeInputLayers(std::vector<NvDsInferLayerInfo> const &inputLayersInfo,
                                               NvDsInferNetworkInfo const &networkInfo,
                                               unsigned int maxBatchSize);

#endif
