// Facts read from NVIDIA TensorRT v8.6.1's include/ headers by scripts/update_trt_oracle_sources.py:
// the enumerators and values, enum counts and flag typedefs that trtexec's option parser names,
// each after the header and line it declares. Included by ../../stubs/NvInfer.h.
#define ORACLE_TENSORRT_MAJOR 8
// include/NvInfer.h:121
using TensorFormats = uint32_t;
// include/NvInfer.h:9002
enum class PreviewFeature : int32_t { kFASTER_DYNAMIC_SHAPES_0805 = 0, kDISABLE_EXTERNAL_TACTIC_SOURCES_FOR_CORE_0805 = 1, kPROFILE_SHARING_0806 = 2 };
// include/NvInfer.h:9046
namespace impl { template <> struct EnumMaxImpl<PreviewFeature> { static constexpr int32_t kVALUE = 3; }; }
// include/NvInfer.h:9056
enum class HardwareCompatibilityLevel : int32_t { kNONE = 0, kAMPERE_PLUS = 1 };
// include/NvInfer.h:9076
namespace impl { template <> struct EnumMaxImpl<HardwareCompatibilityLevel> { static constexpr int32_t kVALUE = 2; }; }
// include/NvInferImpl.h:144
using TacticSources = uint32_t;
// include/NvInferImpl.h:145
using TensorFormats = uint32_t;
// include/NvInferImpl.h:149
using TempfileControlFlags = uint32_t;
// include/NvInferRuntime.h:576
enum class WeightsRole : int32_t { kKERNEL = 0, kBIAS = 1, kSHIFT = 2, kSCALE = 3, kCONSTANT = 4, kANY = 5 };
// include/NvInferRuntime.h:587
namespace impl { template <> struct EnumMaxImpl<WeightsRole> { static constexpr int32_t kVALUE = 6; }; }
// include/NvInferRuntime.h:598
enum class DeviceType : int32_t { kGPU, kDLA };
// include/NvInferRuntime.h:605
namespace impl { template <> struct EnumMaxImpl<DeviceType> { static constexpr int32_t kVALUE = 2; }; }
// include/NvInferRuntime.h:621
enum class TempfileControlFlag : int32_t { kALLOW_IN_MEMORY_FILES = 0, kALLOW_TEMPORARY_FILES = 1 };
// include/NvInferRuntime.h:633
namespace impl { template <> struct EnumMaxImpl<TempfileControlFlag> { static constexpr int32_t kVALUE = 2; }; }
// include/NvInferRuntime.h:644
using TempfileControlFlags = uint32_t;
// include/NvInferRuntime.h:1252
enum class OptProfileSelector : int32_t { kMIN = 0, kOPT = 1, kMAX = 2 };
// include/NvInferRuntime.h:1264
namespace impl { template <> struct EnumMaxImpl<OptProfileSelector> { static constexpr int32_t kVALUE = 3; }; }
// include/NvInferRuntime.h:1471
enum class TacticSource : int32_t { kCUBLAS = 0, kCUBLAS_LT = 1, kCUDNN = 2, kEDGE_MASK_CONVOLUTIONS = 3, kJIT_CONVOLUTIONS = 4 };
// include/NvInferRuntime.h:1505
using TacticSources = uint32_t;
// include/NvInferRuntime.h:1516
enum class ProfilingVerbosity : int32_t { kLAYER_NAMES_ONLY = 0, kNONE = 1, kDETAILED = 2, kDEFAULT = kLAYER_NAMES_ONLY, kVERBOSE = kDETAILED };
// include/NvInferRuntime.h:1529
namespace impl { template <> struct EnumMaxImpl<ProfilingVerbosity> { static constexpr int32_t kVALUE = 3; }; }
// include/NvInferRuntimeBase.h:119
enum class DataType : int32_t { kFLOAT = 0, kHALF = 1, kINT8 = 2, kINT32 = 3, kBOOL = 4, kUINT8 = 5, kFP8 = 6 };
// include/NvInferRuntimeBase.h:160
namespace impl { template <> struct EnumMaxImpl<DataType> { static constexpr int32_t kVALUE = 7; }; }
// include/NvInferRuntimeBase.h:208
enum class TensorFormat : int32_t { kLINEAR = 0, kCHW2 = 1, kHWC8 = 2, kCHW4 = 3, kCHW16 = 4, kCHW32 = 5, kDHWC8 = 6, kCDHW32 = 7, kHWC = 8, kDLA_LINEAR = 9, kDLA_HWC4 = 10, kHWC16 = 11, kDHWC = 12 };
// include/NvInferRuntimeBase.h:336
namespace impl { template <> struct EnumMaxImpl<TensorFormat> { static constexpr int32_t kVALUE = 13; }; }
