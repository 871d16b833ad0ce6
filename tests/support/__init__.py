"""Helpers shared by several test folders (parity weights, inputs and comparison rules)."""
