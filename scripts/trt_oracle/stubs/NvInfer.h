// Stand-in for TensorRT's NvInfer.h, written for the trtexec option-parser oracle (../driver.cpp).
// trtexec's option parser needs only names from libnvinfer's headers: enums, their counts and flag
// typedefs. Those come, per TensorRT tag, from nvinfer_facts.h, which ../sources.py writes into the
// build folder from that tag's include/. Nothing here links to libnvinfer.
#pragma once

#include <cstdint>
// The standard headers TensorRT's own headers bring in, which the parser relies on transitively.
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace nvinfer1
{
namespace impl
{
template <typename T>
struct EnumMaxImpl;
} // namespace impl

template <typename T>
constexpr int32_t EnumMax() noexcept
{
    return impl::EnumMaxImpl<T>::kVALUE;
}

#include "nvinfer_facts.h"

// A shape: TensorRT 8.x's Dims32 holds int32_t extents, 10.x's Dims64 int64_t ones (NvInferRuntimeBase.h).
#if ORACLE_TENSORRT_MAJOR >= 10
using DimExtent = int64_t;
#else
using DimExtent = int32_t;
#endif
class Dims
{
public:
    static constexpr int32_t MAX_DIMS{8};
    int32_t nbDims{};
    DimExtent d[MAX_DIMS]{};
};

// 8.x's UFF input shapes (NvInferLegacyDims.h)
class Dims3 : public Dims
{
public:
    Dims3(DimExtent d0, DimExtent d1, DimExtent d2)
    {
        nbDims = 3;
        d[0] = d0;
        d[1] = d1;
        d[2] = d2;
    }
};
} // namespace nvinfer1
