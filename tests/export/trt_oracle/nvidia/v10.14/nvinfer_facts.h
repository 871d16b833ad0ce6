// Facts read from NVIDIA TensorRT v10.14's include/ headers by scripts/update_trt_oracle_sources.py:
// the enumerators and values, enum counts and flag typedefs that trtexec's option parser names,
// each after the header and line it declares. Included by ../../stubs/NvInfer.h.
#define ORACLE_TENSORRT_MAJOR 10
// include/NvInfer.h:131
using TensorFormats = uint32_t;
// include/NvInfer.h:9406
enum class RuntimePlatform : int32_t { kSAME_AS_BUILD = 0, kWINDOWS_AMD64 = 1 };
// include/NvInfer.h:9426
namespace impl { template <> struct EnumMaxImpl<RuntimePlatform> { static constexpr int32_t kVALUE = 2; }; }
// include/NvInfer.h:9448
enum class BuilderFlag : int32_t { kFP16 = 0, kINT8 = 1, kDEBUG = 2, kGPU_FALLBACK = 3, kREFIT = 4, kDISABLE_TIMING_CACHE = 5, kTF32 = 6, kSPARSE_WEIGHTS = 7, kSAFETY_SCOPE = 8, kOBEY_PRECISION_CONSTRAINTS = 9, kPREFER_PRECISION_CONSTRAINTS = 10, kDIRECT_IO = 11, kREJECT_EMPTY_ALGORITHMS = 12, kVERSION_COMPATIBLE = 13, kEXCLUDE_LEAN_RUNTIME = 14, kFP8 = 15, kERROR_ON_TIMING_CACHE_MISS = 16, kBF16 = 17, kDISABLE_COMPILATION_CACHE = 18, kSTRIP_PLAN = 19, kWEIGHTLESS = kSTRIP_PLAN, kREFIT_IDENTICAL = 20, kWEIGHT_STREAMING = 21, kINT4 = 22, kREFIT_INDIVIDUAL = 23, kSTRICT_NANS = 24, kMONITOR_MEMORY = 25, kFP4 = 26, kEDITABLE_TIMING_CACHE = 27, kDISTRIBUTIVE_INDEPENDENCE = 28 };
// include/NvInfer.h:9632
namespace impl { template <> struct EnumMaxImpl<BuilderFlag> { static constexpr int32_t kVALUE = 29; }; }
// include/NvInfer.h:9885
enum class PreviewFeature : int32_t { kPROFILE_SHARING_0806 = 0, kALIASED_PLUGIN_IO_10_03 = 1, kRUNTIME_ACTIVATION_RESIZE_10_10 = 2 };
// include/NvInfer.h:9914
namespace impl { template <> struct EnumMaxImpl<PreviewFeature> { static constexpr int32_t kVALUE = 3; }; }
// include/NvInfer.h:9929
enum class HardwareCompatibilityLevel : int32_t { kNONE = 0, kAMPERE_PLUS = 1, kSAME_COMPUTE_CAPABILITY = 2 };
// include/NvInfer.h:9966
namespace impl { template <> struct EnumMaxImpl<HardwareCompatibilityLevel> { static constexpr int32_t kVALUE = 3; }; }
// include/NvInfer.h:9982
enum class TilingOptimizationLevel : int32_t { kNONE = 0, kFAST = 1, kMODERATE = 2, kFULL = 3 };
// include/NvInfer.h:10006
namespace impl { template <> struct EnumMaxImpl<TilingOptimizationLevel> { static constexpr int32_t kVALUE = 4; }; }
// include/NvInferImpl.h:226
using TacticSources = uint32_t;
// include/NvInferImpl.h:227
using TensorFormats = uint32_t;
// include/NvInferImpl.h:231
using TempfileControlFlags = uint32_t;
// include/NvInferRuntime.h:1327
enum class WeightsRole : int32_t { kKERNEL = 0, kBIAS = 1, kSHIFT = 2, kSCALE = 3, kCONSTANT = 4, kANY = 5 };
// include/NvInferRuntime.h:1338
namespace impl { template <> struct EnumMaxImpl<WeightsRole> { static constexpr int32_t kVALUE = 6; }; }
// include/NvInferRuntime.h:1349
enum class DeviceType : int32_t { kGPU = 0, kDLA = 1 };
// include/NvInferRuntime.h:1356
namespace impl { template <> struct EnumMaxImpl<DeviceType> { static constexpr int32_t kVALUE = 2; }; }
// include/NvInferRuntime.h:1372
enum class TempfileControlFlag : int32_t { kALLOW_IN_MEMORY_FILES = 0, kALLOW_TEMPORARY_FILES = 1 };
// include/NvInferRuntime.h:1384
namespace impl { template <> struct EnumMaxImpl<TempfileControlFlag> { static constexpr int32_t kVALUE = 2; }; }
// include/NvInferRuntime.h:1396
using TempfileControlFlags = uint32_t;
// include/NvInferRuntime.h:1429
enum class TensorFormat : int32_t { kLINEAR = 0, kCHW2 = 1, kHWC8 = 2, kCHW4 = 3, kCHW16 = 4, kCHW32 = 5, kDHWC8 = 6, kCDHW32 = 7, kHWC = 8, kDLA_LINEAR = 9, kDLA_HWC4 = 10, kHWC16 = 11, kDHWC = 12 };
// include/NvInferRuntime.h:1540
namespace impl { template <> struct EnumMaxImpl<TensorFormat> { static constexpr int32_t kVALUE = 13; }; }
// include/NvInferRuntime.h:2634
enum class OptProfileSelector : int32_t { kMIN = 0, kOPT = 1, kMAX = 2 };
// include/NvInferRuntime.h:2646
namespace impl { template <> struct EnumMaxImpl<OptProfileSelector> { static constexpr int32_t kVALUE = 3; }; }
// include/NvInferRuntime.h:2923
enum class TacticSource : int32_t { kCUBLAS = 0, kCUBLAS_LT = 1, kCUDNN = 2, kEDGE_MASK_CONVOLUTIONS = 3, kJIT_CONVOLUTIONS = 4 };
// include/NvInferRuntime.h:2961
using TacticSources = uint32_t;
// include/NvInferRuntime.h:2972
enum class ProfilingVerbosity : int32_t { kLAYER_NAMES_ONLY = 0, kNONE = 1, kDETAILED = 2 };
// include/NvInferRuntime.h:2980
namespace impl { template <> struct EnumMaxImpl<ProfilingVerbosity> { static constexpr int32_t kVALUE = 3; }; }
// include/NvInferRuntimeBase.h:144
enum class DataType : int32_t { kFLOAT = 0, kHALF = 1, kINT8 = 2, kINT32 = 3, kBOOL = 4, kUINT8 = 5, kFP8 = 6, kBF16 = 7, kINT64 = 8, kINT4 = 9, kFP4 = 10, kE8M0 = 11 };
// include/NvInferRuntimeBase.h:199
namespace impl { template <> struct EnumMaxImpl<DataType> { static constexpr int32_t kVALUE = 12; }; }
