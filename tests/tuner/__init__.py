"""Tests of kvsplit.tuner (the package layout mirrors the source)."""
