// The trtexec option-parser oracle: feeds its argv to NVIDIA's own option parser (sampleOptions.cpp
// of one TensorRT tag, compiled beside this file) the way trtexec's main() does at that tag
// (samples/trtexec/trtexec.cpp: argsToArgumentsMap, parseHelp, AllOptions::parse, then every option
// left unparsed is an "Unknown option"), and prints the verdict:
//   W <text>       each warning the parser logged
//   E <text>       each error trtexec would log
//   ACCEPTED | REJECTED   the last line
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "logger.h"
#include "sampleOptions.h"

namespace
{
// Arguments maps an option to its value (8.x) or to (value, position) (10.x and later).
std::string valueOf(std::string const& value)
{
    return value;
}
std::string valueOf(std::pair<std::string, int32_t> const& value)
{
    return value.first;
}

void printLines(char tag, std::string const& text)
{
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);)
    {
        if (!line.empty())
        {
            std::cout << tag << ' ' << line << '\n';
        }
    }
}
} // namespace

int main(int argc, char** argv)
{
    sample::Arguments args = sample::argsToArgumentsMap(argc, argv);
    sample::AllOptions options;
#ifdef ORACLE_STATIC_PLUGINS
    options.system.enableStaticPlugins = true; // trtexec's main sets this before parsing (10.16 and later)
#endif
    bool failed = false;
    if (sample::parseHelp(args))
    {
        std::cout << "E --help prints the usage and builds nothing\n";
        failed = true;
    }
    else if (args.empty())
    {
        std::cout << "E no options: trtexec prints the usage and builds nothing\n";
        failed = true;
    }
    else
    {
        try
        {
            options.parse(args);
            for (auto const& arg : args)
            {
                sample::gLogError << "Unknown option: " << arg.first << " " << valueOf(arg.second) << "\n";
                failed = true;
            }
        }
        catch (std::invalid_argument const& error)
        {
            sample::gLogError << error.what() << "\n";
            failed = true;
        }
    }
    printLines('W', sample::gLogWarning.str());
    printLines('E', sample::gLogError.str());
    std::cout << (failed ? "REJECTED" : "ACCEPTED") << '\n';
    return failed ? 1 : 0;
}
