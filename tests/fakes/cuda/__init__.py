"""FAKE cuda-python for the dry run of benchmarks/gpu_check.sh: see `bindings/runtime.py`."""
