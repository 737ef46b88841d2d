"""Draft-tree speculative decoding in PyTorch: shapes, drafting, verify and acceptance."""
