"""Ahead-of-time autograd: aten forward/backward graphs (written next)."""
