"""The command line: the entry point (`main`), the subcommands, and what they print."""


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `tfrecipe` console script and `python -m tfrecipe` (see cli.main)."""
    if argv is None:  # the command line's own process: SIGTERM/Ctrl-C handled before imports
        from tfrecipe.fault.preemption import defer_stops

        defer_stops()
    from tfrecipe.cli.main import main as run

    try:
        run(argv)
    except OSError as error:
        _stop_on_a_full_disk(error)
        raise


def _stop_on_a_full_disk(error: OSError) -> None:
    """A disk full before the run could start (Hydra writes `.hydra/` before tfrecipe's code
    runs): one line and summary.json status "failed" instead of Hydra's traceback, exit code 1.
    Returns (the caller re-raises) for any other OSError, or where no run dir was pinned."""
    from tfrecipe.cli.main import _Invocation
    from tfrecipe.fault.disk import is_disk_full, record_failed_start
    from tfrecipe.outcome import EXIT_TRAINING

    run_dir = _Invocation.job_dir or _Invocation.run_dir
    if run_dir is None or not is_disk_full(error) or not run_dir.is_dir():
        return
    try:
        line = record_failed_start(run_dir, error)
    except OSError:  # not even summary.json fits: the line alone
        line = f"tfrecipe: training failed: disk full: no space left in {run_dir}"
    import sys

    print(line, file=sys.stderr)
    raise SystemExit(EXIT_TRAINING) from None


__all__ = ["main"]
