"""scripts/trt_surface.py reads pybind11 binding code and C++ enums the way NVIDIA writes them.

The real sources are not here (the script runs on a clone of NVIDIA/TensorRT); these snippets have
the shapes it meets there: chained .def calls with lambdas, overloads, keyword defaults, a class held
in a variable with a nested enum exported to its scope, and enums with implicit values.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "trt_surface.py"
spec = importlib.util.spec_from_file_location("trt_surface", SCRIPT)
trt_surface = importlib.util.module_from_spec(spec)
spec.loader.exec_module(trt_surface)

BINDINGS = r"""
namespace tensorrt
{
void bindCore(py::module& m)
{
    py::class_<ILogger, PyLogger> baseLoggerBinding{m, "ILogger", ILoggerDoc::descr};
    baseLoggerBinding.def(py::init<>()).def("log", &ILogger::log, "severity"_a, "msg"_a, ILoggerDoc::log);
    py::enum_<ILogger::Severity>(baseLoggerBinding, "Severity", py::arithmetic())
        .value("ERROR", ILogger::Severity::kERROR) // a comment; with a semicolon
        .value("WARNING", ILogger::Severity::kWARNING)
        .export_values();
    py::class_<IRuntime>(m, "Runtime", RuntimeDoc::descr)
        .def(py::init(&nvinfer1::createInferRuntime), "logger"_a, py::keep_alive<1, 2>{})
        .def("deserialize_cuda_engine", lambdas::runtime_deserialize, "serialized_engine"_a)
        .def("deserialize_cuda_engine", [](IRuntime& s, IStreamReader& r) { return s.x(r); },
            "stream_reader"_a)
        .def_property_readonly("logger", &IRuntime::getLogger)
        .def_property("DLA_core", &IRuntime::getDLACore, &IRuntime::setDLACore);
    py::enum_<BuilderFlag>(m, "BuilderFlag", py::arithmetic{}, BuilderFlagDoc::descr)
        .value("FP16", BuilderFlag::kFP16, BuilderFlagDoc::FP16)
        .value("TF32", BuilderFlag::kTF32, BuilderFlagDoc::TF32);
    py::class_<IParser>(m, "OnnxParser", OnnxParserDoc::descr, py::module_local())
        .def("parse", lambdas::parse, "model"_a, "path"_a = nullptr, OnnxParserDoc::parse);
}
} // namespace tensorrt
"""

HEADER = """
enum class BuilderFlag : int32_t
{
    kFP16 = 0, //!< FP16
    kINT8 = 1,
    kDEBUG,
    kTF32 = kDEBUG + 4,
};
class ILogger
{
public:
    enum class Severity : int32_t
    {
        kINTERNAL_ERROR = 0,
        kERROR = 1,
        kWARNING = 2,
    };
};
"""


def test_bindings_give_classes_methods_overloads_keywords_and_nested_enums():
    enums, classes, module = trt_surface.parse_bindings(BINDINGS, None)
    assert {"ILogger", "Runtime", "BuilderFlag", "OnnxParser"} <= set(module)
    assert [m for m, _ in enums["ILogger.Severity"]["members"]] == ["ERROR", "WARNING"]
    assert enums["ILogger.Severity"]["export_values"]
    runtime = classes["Runtime"]["members"]
    assert runtime["deserialize_cuda_engine"]["signatures"] == [
        [["serialized_engine", False]],
        [["stream_reader", False]],
    ]
    assert runtime["__init__"]["signatures"] == [[["logger", False]]]
    assert runtime["logger"] == {"kind": "readonly"} and runtime["DLA_core"] == {"kind": "property"}
    assert classes["ILogger"]["members"]["log"]["signatures"] == [[["severity", False], ["msg", False]]]
    assert classes["OnnxParser"]["members"]["parse"]["signatures"] == [[["model", False], ["path", True]]]


def test_header_enums_follow_cpp_value_rules():
    values = trt_surface.parse_header_enums(HEADER)
    assert values["BuilderFlag"] == {"kFP16": 0, "kINT8": 1, "kDEBUG": 2, "kTF32": 6}
    assert values["Severity"] == {"kINTERNAL_ERROR": 0, "kERROR": 1, "kWARNING": 2}
