/*
 * SPDX-FileCopyrightText: Copyright (c) 1993-2025 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
 * SPDX-License-Identifier: Apache-2.0
 *
 * Licensed under the Apache License, Version 2.0 (the "License");
 * you may not use this file except in compliance with the License.
 * You may obtain a copy of the License at
 *
 * http://www.apache.org/licenses/LICENSE-2.0
 *
 * Unless required by applicable law or agreed to in writing, software
 * distributed under the License is distributed on an "AS IS" BASIS,
 * WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
 * See the License for the specific language governing permissions and
 * limitations under the License.
 */
// Verbatim excerpts of NVIDIA TensorRT v10.14 (https://github.com/NVIDIA/TensorRT) made by scripts/update_trt_oracle_sources.py,
// each after its file and line. Included by ../../stubs/sampleUtils.h.
#ifdef ORACLE_SAMPLE
// samples/common/sampleUtils.h:78
std::vector<std::string> splitToStringVec(std::string const& option, char separator, int64_t maxSplit = -1);
// samples/common/sampleUtils.cpp:108
std::vector<std::string> splitToStringVec(std::string const& s, char separator, int64_t maxSplit)
{
    std::vector<std::string> splitted;

    for (size_t start = 0; start < s.length();)
    {
        // If maxSplit is specified and we have reached maxSplit, emplace back the rest of the string and break the
        // loop.
        if (maxSplit >= 0 && static_cast<int64_t>(splitted.size()) == maxSplit)
        {
            splitted.emplace_back(s.substr(start, s.length() - start));
            break;
        }

        size_t separatorIndex = s.find(separator, start);
        if (separatorIndex == std::string::npos)
        {
            separatorIndex = s.length();
        }
        splitted.emplace_back(s.substr(start, separatorIndex - start));

        // If the separator is the last character, then we should push an empty string at the end.
        if (separatorIndex == s.length() - 1)
        {
            splitted.emplace_back("");
        }

        start = separatorIndex + 1;
    }

    return splitted;
}
#endif
#ifdef ORACLE_SAMPLES_COMMON
// samples/common/common.h:434
inline std::string toLower(const std::string& inp)
{
    std::string out = inp;
    std::transform(out.begin(), out.end(), out.begin(), ::tolower);
    return out;
}
#endif
#ifdef ORACLE_GLOBAL
// samples/common/common.h:108
constexpr long double operator"" _GiB(long double val)
{
    return val * (1 << 30);
}
// samples/common/common.h:112
constexpr long double operator"" _MiB(long double val)
{
    return val * (1 << 20);
}
// samples/common/common.h:116
constexpr long double operator"" _KiB(long double val)
{
    return val * (1 << 10);
}
// samples/common/common.h:81
#define ASSERT(condition)                                                                                              \
    do                                                                                                                 \
    {                                                                                                                  \
        if (!(condition))                                                                                              \
        {                                                                                                              \
            sample::gLogError << "Assertion failure: " << #condition << std::endl;                                     \
            exit(EXIT_FAILURE);                                                                                        \
        }                                                                                                              \
    } while (0)
#endif
