// Stand-in for samples/common/sampleUtils.h (and the part of common.h it pulls in) for the
// option-parser oracle: the helpers the parser calls are NVIDIA's own code of the same tag
// (sample_helpers.h, which ../sources.py cuts from the tag into the build folder); the GPU query is
// fixed, since no GPU is asked.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "logger.h"

#define ORACLE_GLOBAL
#include "sample_helpers.h"
#undef ORACLE_GLOBAL

namespace sample
{
#define ORACLE_SAMPLE
#include "sample_helpers.h"
#undef ORACLE_SAMPLE
} // namespace sample

namespace samplesCommon
{
#define ORACLE_SAMPLES_COMMON
#include "sample_helpers.h"
#undef ORACLE_SAMPLES_COMMON

// The parser asks the GPU's SM version only for the defaults of --best and --int8 (never in our
// lines): answered as an Orin (SM 8.7), so those branches take their "Ampere or newer" path.
inline int32_t getSmVersion()
{
    return 0x0807;
}
inline int32_t getSMVersion()
{
    return getSmVersion();
}
} // namespace samplesCommon
