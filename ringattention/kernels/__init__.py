"""Pallas kernels for one ring step."""
