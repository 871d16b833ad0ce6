// Stand-in for samples/common/logger.h for the option-parser oracle: the parser's log streams are
// collected in memory, and ../driver.cpp prints them after parsing, one line per message.
#pragma once

#include <sstream>

namespace sample
{
inline std::ostringstream gLogVerbose;
inline std::ostringstream gLogInfo;
inline std::ostringstream gLogWarning;
inline std::ostringstream gLogError;
} // namespace sample
