"""Tests of kvsplit.kernels (the package layout mirrors the source)."""
