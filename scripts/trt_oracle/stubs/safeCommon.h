// Stand-in for samples/common/safeCommon.h for the option-parser oracle: only the type the parser
// stores for --safetyPlugins. The safety runtime is not emulated: that option is refused loudly.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace samplesSafeCommon
{
struct SafetyPluginAttribute
{
    std::string pluginNamespace;
    std::string pluginName;
};

struct SafetyPluginLibraryArgument
{
    std::string libraryName;
    std::vector<SafetyPluginAttribute> pluginAttrs;
};

inline bool parseSafetyPluginArgument(std::string const&, SafetyPluginLibraryArgument&)
{
    throw std::logic_error("the oracle does not emulate --safetyPlugins (TensorRT's safety runtime)");
}
} // namespace samplesSafeCommon
