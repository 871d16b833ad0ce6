"""The DeepStream custom library compiles and behaves as nvinfer needs, against our declaration header.

tests/fakes/nvdsinfer/nvdsinfer_custom_impl.h transcribes NVIDIA's documented nvdsinfer API (it says
so at its top); DeepStream itself is not installed here. g++ is a system requirement of the test
suite (scripts/install-system-deps.sh): without it this test fails, it never skips.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[2]
SOURCE = ROOT / "export" / "deepstream" / "nvdsinfer_custom_impl_dfine"
HEADERS = ROOT / "tests" / "fakes" / "nvdsinfer"
RECORD = ROOT / "tests" / "data" / "deepstream_headers.json"  # scripts/record_deepstream_headers.py


def _compiler() -> str:
    compiler = shutil.which("g++")
    assert compiler, "g++ is missing: run scripts/install-system-deps.sh (apt-get install g++ make)"
    assert shutil.which("make"), "make is missing: run scripts/install-system-deps.sh"
    return compiler


def _program_on_the_library(compiler: str, folder: Path, program: str) -> Path:
    """The library built with -Werror against our header (INT64 named, as DeepStream 9 does), and
    the test program `tests/export/<program>` linked to it; returns the program's path."""
    flags = ["-std=c++17", "-Wall", "-Wextra", "-Werror", f"-I{HEADERS}"]
    library = folder / "lib.so"
    source = SOURCE / "nvdsinfer_custom_impl_dfine.cpp"
    shared = ["-DDFINE_NVDSINFER_HAS_INT64", "-fPIC", "-shared", str(source), "-o", str(library)]
    subprocess.run([compiler, *flags, *shared], check=True)
    built = folder / Path(program).stem
    link = [compiler, *flags, str(ROOT / "tests" / "export" / program), str(library), "-o", str(built)]
    subprocess.run([*link, f"-Wl,-rpath,{folder}"], check=True)
    return built


def test_library_builds_with_its_makefile_and_runs_as_nvinfer_calls_it(tmp_path):
    compiler = _compiler()
    build = tmp_path / "lib"
    shutil.copytree(SOURCE, build)
    made = subprocess.run(
        [
            "make",
            "-C",
            str(build),
            f"DS_INCLUDES={HEADERS}",
            "CUDA_INCLUDES=",
            "WERROR=-Werror",
            f"CXX={compiler}",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    assert "-DDFINE_NVDSINFER_HAS_INT64" in made.stdout  # the header declares INT64: named, not a number
    library = build / "libnvdsinfer_custom_impl_dfine.so"
    assert library.is_file()
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True
    ).stdout
    assert (
        " T NvDsInferInitializeInputLayers" in symbols and " T NvDsInferParseDfine" in symbols
    )  # extern "C"

    artifact = tmp_path / "artifact"
    subprocess.run(
        [
            "make",
            "-C",
            str(build),
            "install",
            f"ARTIFACT={artifact}",
            f"DS_INCLUDES={HEADERS}",
            "CUDA_INCLUDES=",
        ],
        check=True,
        capture_output=True,
    )
    assert (artifact / "nvdsinfer_custom_impl_dfine" / "libnvdsinfer_custom_impl_dfine.so").is_file()

    driver = tmp_path / "check"
    subprocess.run(
        [
            compiler,
            "-std=c++17",
            "-Wall",
            "-Werror",
            f"-I{HEADERS}",
            str(ROOT / "tests" / "export" / "deepstream_lib_check.cpp"),
            str(library),
            "-o",
            str(driver),
            f"-Wl,-rpath,{build}",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    out = subprocess.run([str(driver)], check=True, capture_output=True, text=True)
    lines = out.stdout.splitlines()
    record = _recorded()
    for tag, facts in record["tags"].items():  # the same driver against NVIDIA's headers, recorded
        assert lines == facts["driver"], f"DeepStream {tag}: {facts['driver']}"
    assert lines[0] == "init int32 1 640 480 640 480"  # (w, h) in every batch slot
    assert lines[1] == "init int64 1 640 480 640 480"
    assert lines[2] == "init float 0" and lines[3] == "init missing 0"
    kept = " [1 10.0 20.0 100.0 200.0 0.90] [2 0.0 400.0 640.0 80.0 0.60]"  # threshold, class, clipping
    assert lines[4] == "parse int32 1 2" + kept and lines[5] == "parse int64 1 2" + kept
    assert lines[6] == "parse missing 0"
    assert "'labels', 'boxes', 'scores' not all found" in out.stderr
    assert lines[7:] == ["parse float-labels 0 0", "parse uint8-labels 0 0"]  # refused, nothing emitted
    refusals = [line for line in out.stderr.splitlines() if "'labels' has NvDsInferDataType" in line]
    assert [r.split("NvDsInferDataType ")[1].split(",")[0] for r in refusals] == ["0", "5"]
    assert all("expected INT32 or INT64" in r for r in refusals)


def _recorded() -> dict:
    import json

    return json.loads(RECORD.read_text())


def test_nvidias_deepstream_9_headers_build_the_library_and_match_our_transcription(tmp_path):
    """scripts/record_deepstream_headers.py built the library with -Werror against NVIDIA's 9.0.0
    and 9.1.0 headers, INT64 named, and recorded what the layout probe printed there. The probe
    against our transcription (tests/fakes/nvdsinfer) must print the same: the enum values, the
    sizes and offsets of every struct the library reads or fills (it fills a vector of
    NvDsInferObjectDetectionInfo, so a size differing from NVIDIA's would break nvinfer's reading)."""
    compiler = _compiler()
    record = _recorded()
    assert (
        set(record["tags"]) == {"v9.0.0", "v9.1.0"}
        and record["repository"] == "https://github.com/NVIDIA/DeepStream"
    )
    for tag, facts in record["tags"].items():
        assert len(facts["commit"]) == 40 and all(len(b) == 40 for b in facts["blobs"].values()), tag
        assert facts["library_builds_with_werror"] and facts["library_names_int64"], (
            tag,
            facts["library_errors"],
        )
        assert "enum INT64 4" in facts["probe"] and "sizeof NvDsInferObjectDetectionInfo 28" in facts["probe"]
    probe = _program_on_the_library(compiler, tmp_path, "nvdsinfer_layout_probe.cpp")
    ours = subprocess.run([str(probe)], check=True, capture_output=True, text=True).stdout.splitlines()
    for tag, facts in record["tags"].items():
        assert ours == facts["probe"], f"our nvdsinfer transcription differs from NVIDIA's DeepStream {tag}"


def test_library_built_against_headers_without_int64_refuses_int64_tensors(tmp_path):
    """DeepStream 6.x's NvDsInferDataType stops at INT32: the library builds without INT64 and refuses
    an INT64 tensor in one line instead of reading it as another type."""
    compiler = _compiler()
    headers = tmp_path / "ds6"
    headers.mkdir()
    header = (HEADERS / "nvdsinfer_custom_impl.h").read_text()
    kept = [line for line in header.splitlines() if not line.strip().startswith(("INT64 =", "UINT8 ="))]
    (headers / "nvdsinfer_custom_impl.h").write_text(
        "\n".join(kept).replace("INT32 = 3,", "INT32 = 3") + "\n"
    )
    build = tmp_path / "lib"
    shutil.copytree(SOURCE, build)
    make = [
        "make",
        "-C",
        str(build),
        f"DS_INCLUDES={headers}",
        "CUDA_INCLUDES=",
        "WERROR=-Werror",
        f"CXX={compiler}",
    ]
    made = subprocess.run(make, check=True, capture_output=True, text=True)
    assert "DFINE_NVDSINFER_HAS_INT64" not in made.stdout
    driver = tmp_path / "check"
    subprocess.run(  # the driver speaks the newer header; the library was built for the older one
        [
            compiler,
            "-std=c++17",
            f"-I{HEADERS}",
            str(ROOT / "tests" / "export" / "deepstream_lib_check.cpp"),
            str(build / "libnvdsinfer_custom_impl_dfine.so"),
            "-o",
            str(driver),
            f"-Wl,-rpath,{build}",
        ],
        check=True,
        capture_output=True,
    )
    out = subprocess.run([str(driver)], check=True, capture_output=True, text=True)
    lines = out.stdout.splitlines()
    assert lines[0] == "init int32 1 640 480 640 480" and lines[1].startswith("init int64 0")
    assert lines[4].startswith("parse int32 1 2") and lines[5] == "parse int64 0 0"
    assert "expected INT32 (the DeepStream headers this library was built with have no INT64)" in out.stderr


def test_makefile_without_deepstream_says_what_is_missing(tmp_path):
    _compiler()
    build = tmp_path / "lib"
    shutil.copytree(SOURCE, build)
    result = subprocess.run(
        ["make", "-C", str(build), f"DS_INCLUDES={tmp_path / 'nowhere'}"], capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "nvdsinfer_custom_impl.h not found; install DeepStream or set DS_INCLUDES" in result.stderr


def _nvinfer_input(config: Path, frame_bgr):
    """The network input nvinfer makes of a frame already at the network size, as the artifact's
    config_infer_primary_dfine.txt sets it: pixels times net-scale-factor minus offsets, RGB for
    model-color-format=0, planar."""
    import numpy as np

    keys = dict(line.split("=", 1) for line in config.read_text().splitlines() if "=" in line)
    assert keys["model-color-format"] == "0"  # RGB
    offsets = np.array([float(v) for v in keys["offsets"].split(";")], np.float32)
    pixels = frame_bgr[:, :, ::-1].astype(np.float32)
    planar = ((pixels - offsets) * np.float32(float(keys["net-scale-factor"]))).transpose(2, 0, 1)
    return planar[None].copy(), keys


def test_the_parser_on_the_trained_models_tensors_gives_the_detectors_boxes(
    trained_export, trained_model, tmp_path
):
    """The suite's trained model's output tensors for a validation image, computed by onnxruntime
    from the input the nvinfer config describes, go through the library's parser as nvinfer passes
    them; its objects are `Detector`'s detections of the same frame: labels, scores, boxes to 1e-4 px.
    The tensors come from the graph `Detector` runs here, so the comparison is of the parser and its
    input; the engine graph's own parity is gated at export (docs/export.md)."""
    import cv2
    import numpy as np
    import onnxruntime as ort

    from dfine_deploy.artifact import read_artifact
    from dfine_deploy.runtime import Detector

    compiler = _compiler()
    artifact = trained_export
    info = read_artifact(artifact)
    height, width = info.input_height, info.input_width
    image = sorted(trained_model.val.glob("*.jpg"))[0]
    frame = cv2.resize(cv2.imread(str(image)), (width, height), interpolation=cv2.INTER_AREA)
    images, keys = _nvinfer_input(artifact / "config_infer_primary_dfine.txt", frame)
    assert (int(keys["infer-dims"].split(";")[1]), int(keys["infer-dims"].split(";")[2])) == (height, width)
    detector = Detector.open(artifact, backend="onnxruntime", device="cpu", precision="fp32")
    session = ort.InferenceSession(str(detector.source), providers=["CPUExecutionProvider"])
    sizes = np.array([[width, height]], np.int64)  # NvDsInferInitializeInputLayers: the network size
    labels, boxes, scores = session.run(
        ["labels", "boxes", "scores"], {"images": images, "orig_target_sizes": sizes}
    )
    tensors = tmp_path / "tensors"
    tensors.mkdir()
    for name, array, dtype in (
        ("labels", labels, np.int64),
        ("boxes", boxes, np.float32),
        ("scores", scores, np.float32),
    ):
        array[0].astype(dtype).tofile(tensors / f"{name}.bin")

    driver = _program_on_the_library(compiler, tmp_path, "deepstream_tensors_check.cpp")
    # the threshold sits in the widest gap of the 30 best scores, so no detection is a float's width
    # from it in either run
    best = np.sort(scores[0])[::-1][:30]
    gap = int(np.argmax(best[:-1] - best[1:]))
    threshold = repr(float(best[gap] + best[gap + 1]) / 2)
    out = subprocess.run(
        [str(driver), str(tensors), str(width), str(height), keys["num-detected-classes"], threshold],
        check=True,
        capture_output=True,
        text=True,
    )
    rows = np.array([[float(v) for v in line.split()] for line in out.stdout.splitlines()]).reshape(-1, 6)
    parsed = np.column_stack(
        [rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 1] + rows[:, 3], rows[:, 2] + rows[:, 4], rows[:, 5]]
    )

    found = detector.predict([frame])[0]  # opened with no score threshold: every detection
    expected = np.column_stack([found.labels, found.boxes, found.scores]).astype(np.float64)
    expected = expected[expected[:, 5] >= float(threshold)]  # pre-cluster-threshold keeps score >= it
    assert len(expected) > 0, "the trained model finds nothing in its own validation image"

    def ordered(table):
        return table[np.lexsort(table[:, ::-1].T)]

    got, want = ordered(parsed), ordered(expected)
    assert got.shape == want.shape, (got, want)
    np.testing.assert_array_equal(got[:, 0], want[:, 0])
    np.testing.assert_allclose(got[:, 1:5], want[:, 1:5], rtol=0, atol=1e-4)
    np.testing.assert_allclose(got[:, 5], want[:, 5], rtol=0, atol=1e-6)
