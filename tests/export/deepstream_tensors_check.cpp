// Feeds one frame of a real model's output tensors to the nvdsinfer custom library's parser as
// nvinfer hands them over (tests/export/test_deepstream_lib.py writes them):
//   deepstream_tensors_check DIR WIDTH HEIGHT CLASSES THRESHOLD
// DIR holds labels.bin (int64), boxes.bin (float32 xyxy), scores.bin (float32), K detections each.
// Prints one line per object the parser emits: classId left top width height confidence.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "nvdsinfer_custom_impl.h"

extern "C" bool NvDsInferParseDfine(std::vector<NvDsInferLayerInfo> const &, NvDsInferNetworkInfo const &,
                                    NvDsInferParseDetectionParams const &,
                                    std::vector<NvDsInferObjectDetectionInfo> &);

template <typename T>
static std::vector<T> readAll(std::string const &path) {
  std::vector<T> data;
  FILE *file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return data;
  T value;
  while (std::fread(&value, sizeof(T), 1, file) == 1) data.push_back(value);
  std::fclose(file);
  return data;
}

static NvDsInferLayerInfo layer(const char *name, NvDsInferDataType type, size_t elements, void *buffer) {
  NvDsInferLayerInfo info{};
  info.dataType = type;
  info.inferDims.numDims = 1;
  info.inferDims.d[0] = static_cast<unsigned int>(elements);
  info.inferDims.numElements = static_cast<unsigned int>(elements);
  info.layerName = name;
  info.buffer = buffer;
  return info;
}

int main(int argc, char **argv) {
  if (argc != 6) return 2;
  std::string dir = argv[1];
  auto labels = readAll<int64_t>(dir + "/labels.bin");
  auto boxes = readAll<float>(dir + "/boxes.bin");
  auto scores = readAll<float>(dir + "/scores.bin");
  NvDsInferNetworkInfo network{static_cast<unsigned int>(std::atoi(argv[2])),
                               static_cast<unsigned int>(std::atoi(argv[3])), 3};
  NvDsInferParseDetectionParams params{};
  params.numClassesConfigured = static_cast<unsigned int>(std::atoi(argv[4]));
  params.perClassPreclusterThreshold.assign(params.numClassesConfigured, std::strtof(argv[5], nullptr));
  std::vector<NvDsInferLayerInfo> outputs = {layer("labels", INT64, labels.size(), labels.data()),
                                             layer("boxes", FLOAT, boxes.size(), boxes.data()),
                                             layer("scores", FLOAT, scores.size(), scores.data())};
  std::vector<NvDsInferObjectDetectionInfo> objects;
  if (!NvDsInferParseDfine(outputs, network, params, objects)) return 1;
  for (auto const &o : objects) {
    std::printf("%u %.6f %.6f %.6f %.6f %.6f\n", o.classId, o.left, o.top, o.width, o.height,
                o.detectionConfidence);
  }
  return 0;
}
