/*
 * SPDX-FileCopyrightText: Copyright (c) 1993-2023 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
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
// Verbatim excerpts of NVIDIA TensorRT v8.6.1 (https://github.com/NVIDIA/TensorRT) made by scripts/update_trt_oracle_sources.py,
// each after its file and line. Included by ../../stubs/sampleUtils.h.
#ifdef ORACLE_SAMPLE
// samples/common/sampleUtils.h:77
std::vector<std::string> splitToStringVec(std::string const& option, char separator);
// samples/common/sampleUtils.cpp:101
std::vector<std::string> splitToStringVec(std::string const& s, char separator)
{
    std::vector<std::string> splitted;

    for (size_t start = 0; start < s.length();)
    {
        size_t separatorIndex = s.find(separator, start);
        if (separatorIndex == std::string::npos)
        {
            separatorIndex = s.length();
        }
        splitted.emplace_back(s.substr(start, separatorIndex - start));
        start = separatorIndex + 1;
    }

    return splitted;
}
#endif
#ifdef ORACLE_SAMPLES_COMMON
// samples/common/common.h:493
inline std::string toLower(const std::string& inp)
{
    std::string out = inp;
    std::transform(out.begin(), out.end(), out.begin(), ::tolower);
    return out;
}
#endif
#ifdef ORACLE_GLOBAL
// samples/common/common.h:110
constexpr long double operator"" _GiB(long double val)
{
    return val * (1 << 30);
}
// samples/common/common.h:114
constexpr long double operator"" _MiB(long double val)
{
    return val * (1 << 20);
}
// samples/common/common.h:118
constexpr long double operator"" _KiB(long double val)
{
    return val * (1 << 10);
}
// samples/common/common.h:86
#define ASSERT(condition)                                                   \
    do                                                                      \
    {                                                                       \
        if (!(condition))                                                   \
        {                                                                   \
            sample::gLogError << "Assertion failure: " << #condition << std::endl;  \
            abort();                                                        \
        }                                                                   \
    } while (0)
#endif
