"""sbxkit's benchmarks: ratios against baselines measured in the same run (bench/README.md,
"Method").

Each benchmark is a module exposing ``NAME``, ``SUMMARY``, ``add_arguments(parser)`` and
``main(args) -> int`` and is registered in ``bench.__main__.BENCHMARKS``. ``python -m bench``
runs them all; ``python -m bench NAME [options]`` runs one.
"""
