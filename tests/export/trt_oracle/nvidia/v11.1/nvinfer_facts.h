// Facts read from NVIDIA TensorRT v11.1's include/ headers by scripts/update_trt_oracle_sources.py:
// the enumerators and values, enum counts and flag typedefs that trtexec's option parser names,
// each after the header and line it declares. Included by ../../stubs/NvInfer.h.
#define ORACLE_TENSORRT_MAJOR 11
// include/NvInfer.h:135
using TensorFormats = uint32_t;
// include/NvInfer.h:9919
enum class RuntimePlatform : int32_t { kSAME_AS_BUILD = 0, kWINDOWS_AMD64 = 1 };
// include/NvInfer.h:9937
namespace impl { template <> struct EnumMaxImpl<RuntimePlatform> { static constexpr int32_t kVALUE = 2; }; }
// include/NvInfer.h:10362
enum class PreviewFeature : int32_t { kALIASED_PLUGIN_IO_10_03 = 0, kRUNTIME_ACTIVATION_RESIZE_10_10 = 1 };
// include/NvInfer.h:10382
namespace impl { template <> struct EnumMaxImpl<PreviewFeature> { static constexpr int32_t kVALUE = 2; }; }
// include/NvInfer.h:10396
enum class HardwareCompatibilityLevel : int32_t { kNONE = 0, kAMPERE_PLUS = 1, kSAME_COMPUTE_CAPABILITY = 2 };
// include/NvInfer.h:10431
namespace impl { template <> struct EnumMaxImpl<HardwareCompatibilityLevel> { static constexpr int32_t kVALUE = 3; }; }
// include/NvInfer.h:10446
enum class TilingOptimizationLevel : int32_t { kNONE = 0, kFAST = 1, kMODERATE = 2, kFULL = 3 };
// include/NvInfer.h:10468
namespace impl { template <> struct EnumMaxImpl<TilingOptimizationLevel> { static constexpr int32_t kVALUE = 4; }; }
// include/NvInferImpl.h:214
using TacticSources = uint32_t;
// include/NvInferImpl.h:215
using TensorFormats = uint32_t;
// include/NvInferImpl.h:218
using TempfileControlFlags = uint32_t;
// include/NvInferRuntime.h:1318
enum class WeightsRole : int32_t { kKERNEL = 0, kBIAS = 1, kSHIFT = 2, kSCALE = 3, kCONSTANT = 4, kANY = 5 };
// include/NvInferRuntime.h:1329
namespace impl { template <> struct EnumMaxImpl<WeightsRole> { static constexpr int32_t kVALUE = 6; }; }
// include/NvInferRuntime.h:1340
enum class DeviceType : int32_t { kGPU = 0, kDLA = 1 };
// include/NvInferRuntime.h:1347
namespace impl { template <> struct EnumMaxImpl<DeviceType> { static constexpr int32_t kVALUE = 2; }; }
// include/NvInferRuntime.h:1363
enum class TempfileControlFlag : int32_t { kALLOW_IN_MEMORY_FILES = 0, kALLOW_TEMPORARY_FILES = 1 };
// include/NvInferRuntime.h:1375
namespace impl { template <> struct EnumMaxImpl<TempfileControlFlag> { static constexpr int32_t kVALUE = 2; }; }
// include/NvInferRuntime.h:1387
using TempfileControlFlags = uint32_t;
// include/NvInferRuntime.h:1420
enum class TensorFormat : int32_t { kLINEAR = 0, kCHW2 = 1, kHWC8 = 2, kCHW4 = 3, kCHW16 = 4, kCHW32 = 5, kDHWC8 = 6, kCDHW32 = 7, kHWC = 8, kDLA_LINEAR = 9, kDLA_HWC4 = 10, kHWC16 = 11, kDHWC = 12 };
// include/NvInferRuntime.h:1529
namespace impl { template <> struct EnumMaxImpl<TensorFormat> { static constexpr int32_t kVALUE = 13; }; }
// include/NvInferRuntime.h:2538
enum class OptProfileSelector : int32_t { kMIN = 0, kOPT = 1, kMAX = 2 };
// include/NvInferRuntime.h:2546
namespace impl { template <> struct EnumMaxImpl<OptProfileSelector> { static constexpr int32_t kVALUE = 3; }; }
// include/NvInferRuntime.h:2755
enum class TacticSource : int32_t { kEDGE_MASK_CONVOLUTIONS = 0, kJIT_CONVOLUTIONS = 1 };
// include/NvInferRuntime.h:2768
namespace impl { template <> struct EnumMaxImpl<TacticSource> { static constexpr int32_t kVALUE = 2; }; }
// include/NvInferRuntime.h:2780
using TacticSources = uint32_t;
// include/NvInferRuntime.h:2791
enum class ProfilingVerbosity : int32_t { kLAYER_NAMES_ONLY = 0, kNONE = 1, kDETAILED = 2 };
// include/NvInferRuntime.h:2799
namespace impl { template <> struct EnumMaxImpl<ProfilingVerbosity> { static constexpr int32_t kVALUE = 3; }; }
// include/NvInferRuntimeBase.h:148
enum class DataType : int32_t { kFLOAT = 0, kHALF = 1, kINT8 = 2, kINT32 = 3, kBOOL = 4, kUINT8 = 5, kFP8 = 6, kBF16 = 7, kINT64 = 8, kINT4 = 9, kFP4 = 10, kE8M0 = 11 };
// include/NvInferRuntimeBase.h:203
namespace impl { template <> struct EnumMaxImpl<DataType> { static constexpr int32_t kVALUE = 12; }; }
