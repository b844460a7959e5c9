"""Adapters that plug :class:`kvsplit.kernels.wrapper.DecodeWrapper` into serving engines.

Each adapter is its own module and imports its engine only there (``kvsplit.kernels.integrations.transformers``
needs ``transformers``; install it with the ``kvsplit[transformers]`` extra).
"""
