"""kvsplit.kernels: the Triton decode kernel, its fp32 reference and the NumPy planner.

The planner (``plan``, ``buckets``, ``device``) needs only NumPy; ``decode``
needs torch and Triton.
"""
