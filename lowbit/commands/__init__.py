"""One module per ``lowbit`` subcommand; each defines ``register(subparsers)``.

Modules here only parse arguments and print; the work happens in the library packages.
Imports of heavy libraries (transformers) stay inside the run functions so ``--help`` is quick.
"""
