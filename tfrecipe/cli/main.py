"""The command line: `tfrecipe [overrides]` / `python -m tfrecipe [overrides]`, and its
subcommands (`tfrecipe ls`, `validate`, `predict`, ...).

This module dispatches (a subcommand from `cli.commands`, else the training command,
`cli.train_command`) and turns what ends a command into its exit code: 2 and one line for a
config error (no traceback), 130 for Ctrl-C, and the codes of `tfrecipe.outcome`. The paths
that need no training (`--help`, `--version`, `ls`, `validate`, a config error) import no
TensorFlow.
"""

from __future__ import annotations

import os
import sys

from tfrecipe.errors import ConfigError
from tfrecipe.outcome import EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_PREEMPTED


def main(argv: list[str] | None = None) -> None:
    """Entry point of `tfrecipe` and `python -m tfrecipe`; with no `argv` (the command line)
    it ends the process itself once everything is written (`_exit_fast`)."""
    if argv is None:
        try:
            _main(sys.argv[1:])
        except SystemExit as stop:
            _exit_fast(stop.code)
        _exit_fast(0)
    _main(argv)


def _exit_fast(code) -> None:
    """Ends a process that imported TensorFlow without its teardown (≈3 s of destructors on a
    small CPU, the same work the OS does at once), after what a normal exit keeps, in the
    interpreter's order: threading's exit hooks (they stop thread pools' idle workers:
    concurrent.futures, joblib's loky), other threads finished, atexit handlers (logging,
    W&B) run, output flushed."""
    if "tensorflow" not in sys.modules:
        raise SystemExit(code)
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    import atexit
    import threading

    # What Py_FinalizeEx calls first; joining the threads without it waits forever on an
    # executor nobody shut down (Python 3.11-3.13; tests/test_compat.py checks the name).
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def _main(argv: list[str]) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter
    os.environ["HYDRA_FULL_ERROR"] = "1"  # errors reach us: we report them, exit code 2
    if "--version" in argv:  # tfrecipe's, not Hydra's (which answers it otherwise)
        print(_version())
        return
    from tfrecipe.cli.hydra_errors import describe, hydra_errors
    from tfrecipe.config.secrets import redact_text
    from tfrecipe.fault.preemption import Preempted
    from tfrecipe.outcome import run_dir_named
    from tfrecipe.printed import printable_lines

    try:
        with run_dir_named("hydra.run.dir"):  # the command line's name (the Python API's: run_dir)
            _dispatch(_spelled_out(list(argv)))
    except ConfigError as error:
        # A problem may quote a received file's text: its lines, control characters escaped.
        print(printable_lines(redact_text(error.report())), file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    except hydra_errors() as error:
        from tfrecipe.config.compose import every_error

        each = ConfigError([redact_text(describe(e)) for e in every_error(error)])
        # each unknown option or key on its line, control characters escaped
        print(printable_lines(each.report()), file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    except KeyboardInterrupt:  # a second Ctrl-C
        print("tfrecipe: interrupted (Ctrl-C): stopped without a backup", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None
    except Preempted as stopped:  # SIGTERM/Ctrl-C before a command watched for them
        print(f"tfrecipe: {stopped}", file=sys.stderr)
        raise SystemExit(EXIT_PREEMPTED) from None
    except BrokenPipeError:  # `tfrecipe ls | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(0) from None


def _spelled_out(argv: list[str]) -> list[str]:
    """The shorthands as the overrides they stand for: `help`, `lr-find`, a recipe file."""
    if argv[:1] == ["help"]:
        return ["--help", *argv[1:]]
    if argv[:1] == ["lr-find"]:  # a run that is the learning-rate sweep only
        return [*argv[1:], "loop.lr_find.enabled=true", "loop.lr_find.only=true"]
    if argv and "=" not in argv[0] and argv[0].endswith((".yaml", ".yml")):  # a recipe file
        return [f"recipe={argv[0]}", *argv[1:]]
    return argv


def _dispatch(argv: list[str]) -> None:
    """A subcommand (`tfrecipe ls`, ...), else the training command."""
    from tfrecipe.cli.commands import COMMANDS

    if argv and argv[0] in COMMANDS:
        from tfrecipe.fault.preemption import restore_default_stops

        restore_default_stops()  # only a training run records how it stopped
        COMMANDS[argv[0]](argv[1:])
    else:
        from tfrecipe.cli.train_command import run

        run(argv)


def _version() -> str:
    """`tfrecipe 0.1.0 (Hydra 1.3.2)`, from the installed packages' metadata (no imports)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        own = version("tfrecipe")
    except PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        own = "unknown (not installed)"
    return f"tfrecipe {own} (Hydra {version('hydra-core')})"
