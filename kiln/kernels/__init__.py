"""The kernel compiler: loop IR, fusion, Triton and C++ codegen (written next)."""
