"""FAKE `cuda.bindings` (cuda-python 12.8+ layout): only `runtime` is modelled."""
