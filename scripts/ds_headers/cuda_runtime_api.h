// OUR STAND-IN, NOT NVIDIA'S FILE: the two CUDA handle types TensorRT's public headers name
// (NvInferRuntimeBase.h includes <cuda_runtime_api.h>), declared as opaque pointers the way the
// CUDA runtime declares them. It lets scripts/record_deepstream_headers.py compile against NVIDIA's
// DeepStream and TensorRT headers on a machine without the CUDA toolkit; nothing here is called.
#pragma once
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
