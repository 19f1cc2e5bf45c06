"""Model loading and placement, the engine thread, cost tables, the CPU GEMM plan, paths and target hooks."""
