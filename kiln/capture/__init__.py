"""Capture: CPython bytecode → torch-level FX graphs, guards, and resume functions."""
