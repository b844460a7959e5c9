"""Tests of kvsplit.service (the package layout mirrors the source)."""
