"""``python -m kvsplit.service.cli``: the ``kvsplit`` command line."""

from . import main

main()
