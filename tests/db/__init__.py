"""Tests of kvsplit.db (the package layout mirrors the source)."""
