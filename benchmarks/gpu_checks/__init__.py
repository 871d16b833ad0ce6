"""The checks that benchmarks/gpu_check.py runs on a GPU machine, by side (torch, deployment backends)."""
