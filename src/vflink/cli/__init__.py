"""The ``vflink`` command line (thin: parsing, progress and tables; work is in the runner)."""
