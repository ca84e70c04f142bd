"""The command line: the entry point (`main`), the subcommands, and what they print."""

from tfrecipe.cli.main import main

__all__ = ["main"]
