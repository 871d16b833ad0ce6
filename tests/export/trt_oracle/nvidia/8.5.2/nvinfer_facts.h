// Facts read from NVIDIA TensorRT 8.5.2's include/ headers by scripts/update_trt_oracle_sources.py:
// the enumerators and values, enum counts and flag typedefs that trtexec's option parser names,
// each after the header and line it declares. Included by ../../stubs/NvInfer.h.
#define ORACLE_TENSORRT_MAJOR 8
// include/NvInfer.h:118
using TensorFormats = uint32_t;
// include/NvInfer.h:8586
enum class PreviewFeature : int32_t { kFASTER_DYNAMIC_SHAPES_0805 = 0, kDISABLE_EXTERNAL_TACTIC_SOURCES_FOR_CORE_0805 = 1 };
// include/NvInfer.h:8619
namespace impl { template <> struct EnumMaxImpl<PreviewFeature> { static constexpr int32_t kVALUE = 2; }; }
// include/NvInferImpl.h:137
using TacticSources = uint32_t;
// include/NvInferImpl.h:138
using TensorFormats = uint32_t;
// include/NvInferRuntime.h:575
enum class WeightsRole : int32_t { kKERNEL = 0, kBIAS = 1, kSHIFT = 2, kSCALE = 3, kCONSTANT = 4, kANY = 5 };
// include/NvInferRuntime.h:586
namespace impl { template <> struct EnumMaxImpl<WeightsRole> { static constexpr int32_t kVALUE = 6; }; }
// include/NvInferRuntime.h:1092
enum class OptProfileSelector : int32_t { kMIN = 0, kOPT = 1, kMAX = 2 };
// include/NvInferRuntime.h:1104
namespace impl { template <> struct EnumMaxImpl<OptProfileSelector> { static constexpr int32_t kVALUE = 3; }; }
// include/NvInferRuntime.h:1311
enum class TacticSource : int32_t { kCUBLAS = 0, kCUBLAS_LT = 1, kCUDNN = 2, kEDGE_MASK_CONVOLUTIONS = 3, kJIT_CONVOLUTIONS = 4 };
// include/NvInferRuntime.h:1345
using TacticSources = uint32_t;
// include/NvInferRuntime.h:1356
enum class ProfilingVerbosity : int32_t { kLAYER_NAMES_ONLY = 0, kNONE = 1, kDETAILED = 2, kDEFAULT = kLAYER_NAMES_ONLY, kVERBOSE = kDETAILED };
// include/NvInferRuntime.h:1369
namespace impl { template <> struct EnumMaxImpl<ProfilingVerbosity> { static constexpr int32_t kVALUE = 3; }; }
// include/NvInferRuntimeCommon.h:116
enum class DataType : int32_t { kFLOAT = 0, kHALF = 1, kINT8 = 2, kINT32 = 3, kBOOL = 4, kUINT8 = 5 };
// include/NvInferRuntimeCommon.h:152
namespace impl { template <> struct EnumMaxImpl<DataType> { static constexpr int32_t kVALUE = 6; }; }
// include/NvInferRuntimeCommon.h:200
enum class TensorFormat : int32_t { kLINEAR = 0, kCHW2 = 1, kHWC8 = 2, kCHW4 = 3, kCHW16 = 4, kCHW32 = 5, kDHWC8 = 6, kCDHW32 = 7, kHWC = 8, kDLA_LINEAR = 9, kDLA_HWC4 = 10, kHWC16 = 11 };
// include/NvInferRuntimeCommon.h:331
namespace impl { template <> struct EnumMaxImpl<TensorFormat> { static constexpr int32_t kVALUE = 12; }; }
