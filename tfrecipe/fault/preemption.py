"""Preemption: SIGTERM (or Ctrl-C) -> a backup at a step every worker agrees on -> a clean exit.

Under submitit (Hydra's `submitit_slurm` launcher), its signal (SIGUSR2) before a time limit or a
preemption is handled the same way, then handed over to submitit's own handler, which requeues the
job; the requeued job resumes from the backup (`hand_over_to_submitit`).

Cluster managers (SLURM, Kubernetes, GCE) send SIGTERM some seconds before they stop a task. On
every strategy but parameter servers, TensorFlow's `PreemptionCheckpointHandler` picks the step:
the worker that got the signal publishes "save after step N+1" through the coordination service,
every worker saves there and exits, so all of them hold the same state. We use it with our own
save function (the backup's CheckpointManager, which also keeps periodic backups) and an exit
function that raises `Preempted`, so train() writes summary.json (status "preempted") and the
command line exits with `outcome.EXIT_PREEMPTED` (75); the next start restores that backup (zero
lost steps).

Facts this module works around (measured on TF 2.21):
- The handler restores the latest checkpoint of the manager it is given when it is constructed.
  We restore ourselves (with fallback and `resume=`), so it gets a manager over an empty
  checkpoint in an empty directory: nothing to restore, and it never saves there (save_fn).
- Off Google Cloud it would exit with code 42: our exit_fn raises instead.
- It probes the GCE metadata server (up to 5 s) when constructed. A machine that is not a GCE VM
  says so in its DMI product name; there the probe is pointed at a closed local port (refused at
  once) for the construction only.
- It refuses clusters with parameter servers: there the coordinator is the only process that
  trains, so a plain SIGTERM flag checked at the step boundary agrees with itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger("tfrecipe")

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # Ctrl-C stops a run as a preemption does


def _watched_signals() -> list[signal.Signals]:
    """SIGTERM, and SIGINT unless it is ignored (a shell script's background job: Ctrl-C there
    is meant for the script)."""
    return [s for s in _STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]


def submitit_signal() -> signal.Signals | None:
    """The signal submitit sends this job before a time limit or a preemption (SIGUSR2 unless
    SUBMITIT_PREEMPT_SIGNAL says otherwise), when this process is a submitit job
    (hydra/launcher=submitit_slurm) whose handler is installed; else None."""
    if "SUBMITIT_EXECUTOR" not in os.environ:
        return None
    signum = getattr(signal, f"SIG{os.environ.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')}", None)
    return signum if signum is not None and callable(signal.getsignal(signum)) else None


# submitit's own handler of its signal while tfrecipe watches it: saving comes first, then
# `hand_over_to_submitit` calls it (it checkpoints the job's submission and requeues the job).
_submitit_handler: list[Callable] = []


def _take_submitit_signal(handler: Callable) -> Callable[[], None]:
    """Puts `handler` on submitit's signal (when this is a submitit job), keeping submitit's for
    `hand_over_to_submitit`; returns what gives submitit its handler back."""
    signum = submitit_signal()
    if signum is None or signal.getsignal(signum) is handler:
        return lambda: None
    _submitit_handler[:] = [signal.signal(signum, handler)]
    return lambda: signal.signal(signum, _submitit_handler[0])


def hand_over_to_submitit(preempted: Preempted) -> None:
    """After a stop on submitit's signal (the run saved a backup, summary.json says preempted),
    runs submitit's handler: it requeues the job (`scontrol requeue`) and exits, and the
    requeued job resumes from the backup. A no-op after any other stop."""
    if not _submitit_handler or preempted.signal_name != _signal_name(submitit_signal()):
        return
    signum = submitit_signal()
    log.warning("handing over to submitit: it requeues the job, which resumes from the backup")
    _submitit_handler[0](signum, None)


def _signal_name(signum: signal.Signals | None) -> str | None:
    return signal.Signals(signum).name if signum is not None else None


class Preempted(Exception):
    """Training stopped on SIGTERM or SIGINT (Ctrl-C), after saving a backup when it had begun.

    Args:
      step: the step the backup holds.
      signal_name: the signal that stopped it.
      saved: False when it stopped before training began (nothing to back up).
    """

    def __init__(
        self, step: int | None = None, *, signal_name: str = "SIGTERM", saved: bool = True
    ):
        self.step, self.signal_name = step, signal_name
        reason = f"{'interrupted' if signal_name == 'SIGINT' else 'preempted'} ({signal_name})"
        where = f" at step {step}" if step is not None else ""
        if saved:
            message = f"{reason}: backup saved{where}; rerun to resume"
        else:
            message = f"{reason} before training began: nothing to back up; rerun to start again"
        super().__init__(message)


@contextlib.contextmanager
def signals_preempt() -> Iterator[None]:
    """SIGTERM and Ctrl-C stop the run with `Preempted` (exit code 75, one line, summary.json
    "preempted") while training is not watching for them yet (`watch` takes over then); a
    no-op outside the main thread, where signal handlers cannot be set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _stop_now) for signum in _watched_signals()}
    give_back = _take_submitit_signal(_stop_now)
    try:
        stop_if_signalled()  # noted while the process started
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        give_back()


def _stop_now(signum, frame):
    raise Preempted(signal_name=signal.Signals(signum).name, saved=False)


_pending: list[str] = []  # a stop signal that came before the run could act on it


def defer_stops() -> None:
    """The first thing the command line's process does, before its imports: SIGTERM and Ctrl-C
    are noted (`stop_if_signalled` acts on them once the run dir is known), not left to their
    default handlers, which end the process with 143/130 and no summary.json. Noted, not raised
    at once: an exception raised in the middle of an import or a library's `except Exception`
    would be lost or leave it half done. A second Ctrl-C stops at once (KeyboardInterrupt)."""

    def note(signum, frame) -> None:
        if signum == signal.SIGINT and _pending:
            raise KeyboardInterrupt
        _pending.append(signal.Signals(signum).name)

    for signum in _watched_signals():
        signal.signal(signum, note)


def stop_requested() -> str | None:
    """The stop signal `defer_stops` noted (its name), if any."""
    return _pending[0] if _pending else None


def in_worker_process() -> bool:
    """Whether this process is a worker a sweep's process started with multiprocessing (joblib's
    loky workers run its jobs one after another)."""
    import multiprocessing

    return multiprocessing.parent_process() is not None


def note_stop(signal_name: str) -> None:
    """A worker process remembers that its job was stopped: the sweep is stopping, and the next
    job it is handed stops before it trains (`stop_if_signalled`)."""
    if not _pending:
        _pending.append(signal_name)


def stop_if_signalled() -> None:
    """Raises `Preempted` (nothing saved) when a stop signal was noted (`defer_stops`)."""
    if _pending:
        raise Preempted(signal_name=_pending[0], saved=False)


def restore_default_stops() -> None:
    """SIGTERM and Ctrl-C back to Python's defaults (a subcommand stops as any program does)."""
    handlers = {signal.SIGTERM: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}
    for signum in _watched_signals():
        signal.signal(signum, handlers[signum])
    if _pending:
        signal.raise_signal(getattr(signal, _pending[0]))


@contextlib.contextmanager
def forwarded_to_workers() -> Iterator[None]:
    """A sweep's process whose jobs train in worker processes it started (Hydra's joblib
    launcher: loky's workers) passes SIGTERM and Ctrl-C on to them as SIGTERM, so each job saves
    its backup and ends preempted, as an in-process job would; the sweep then ends with them.
    The signal is noted here as before (`defer_stops`). A no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum, frame) -> None:
        import multiprocessing

        workers = multiprocessing.active_children()  # loky's are Process objects; none else
        if workers and not _pending:
            log.warning(
                "%s: stopping the sweep's %d worker process(es): each job saves a backup",
                signal.Signals(signum).name,
                len(workers),
            )
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGTERM)
        if callable(previous[signum]):  # `defer_stops`' note (a second Ctrl-C: at once)
            previous[signum](signum, frame)

    previous = {signum: signal.signal(signum, forward) for signum in _watched_signals()}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class Watcher:
    """`check()` at each step boundary: saves and raises `Preempted` once the run is preempted.

    `close()` stops watching and gives SIGTERM and SIGINT back their previous handlers.
    """

    def __init__(self, check: Callable[[], None], close: Callable[[], None]):
        self.check, self.close = check, close


def watch(
    *,
    save: Callable[[], str | None],
    cluster_resolver,
    parameter_servers: bool,
    current_step: Callable[[], int],
) -> Watcher | None:
    """Starts watching for SIGTERM and Ctrl-C; None where a signal handler cannot be installed (a thread).

    Args:
      save: saves a backup of the current state (every worker calls it).
      cluster_resolver: the strategy's cluster resolver (None for a single process).
      parameter_servers: the run trains through a ClusterCoordinator.
      current_step: the optimizer step, for the message.
    """
    if threading.current_thread() is not threading.main_thread():
        log.warning("preemption: not in the main thread, SIGTERM is not watched")
        return None
    previous = {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS}
    submitit = submitit_signal()
    if submitit is not None:
        previous[submitit] = signal.getsignal(submitit)

    def restore_handler() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    received = ["SIGTERM"]  # the signal that stops the run: SIGINT when Ctrl-C forwarded it
    if parameter_servers:
        watcher = _flag_watcher(save, current_step, restore_handler, received)
    else:
        watcher = _handler_watcher(save, cluster_resolver, current_step, restore_handler, received)
    if signal.SIGINT in _watched_signals():
        _forward_ctrl_c(received)
    if submitit is not None:
        _forward_submitit_signal(submitit, received)
    return watcher


def _forward_submitit_signal(signum: signal.Signals, received: list[str]) -> None:
    """submitit's signal (a preemption or time limit ahead) is handled as SIGTERM: a backup at
    the next step every worker agrees on, then `Preempted`, then `hand_over_to_submitit`."""

    def forward(signum_received, frame) -> None:
        received[0] = signal.Signals(signum_received).name
        log.warning("%s from submitit: saving a backup at the next step", received[0])
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signum, forward)


def _forward_ctrl_c(received: list[str]) -> None:
    """Ctrl-C (SIGINT) is handled as SIGTERM: a backup, then `Preempted`. A second Ctrl-C
    stops at once, without one (KeyboardInterrupt)."""

    def forward(signum, frame) -> None:
        received[0] = "SIGINT"
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log.warning(
            "interrupted (SIGINT): saving a backup at the next step (Ctrl-C again stops at "
            "once, without one)"
        )
        os.kill(os.getpid(), signal.SIGTERM)  # whatever watches SIGTERM takes it from here

    signal.signal(signal.SIGINT, forward)


def _flag_watcher(save, current_step, restore_handler, received: list[str]) -> Watcher:
    flag = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: flag.set())

    def check() -> None:
        if flag.is_set():
            save()
            raise Preempted(current_step(), signal_name=received[0])

    return Watcher(check, restore_handler)


def _handler_watcher(
    save, cluster_resolver, current_step, restore_handler, received: list[str]
) -> Watcher:
    import tensorflow as tf

    def exit_fn() -> None:
        raise Preempted(current_step(), signal_name=received[0])

    from tfrecipe import printed

    # The handler reads its own deprecated `total_run_calls` when it saves: three lines of
    # deprecation warning at every preemption.
    printed.quiet("tensorflow", "PreemptionCheckpointHandler.total_run_calls")
    config = tf.distribute.experimental.TerminationConfig(
        exit_fn=exit_fn, save_fn=lambda *args, **kwargs: save(), grace_period=0
    )
    scratch = Path(tempfile.mkdtemp(prefix="tfrecipe-preemption-"))
    # An empty checkpoint in an empty directory: the handler restores nothing (see above).
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(), str(scratch), max_to_keep=1)
    with _no_gce_probe():
        handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            cluster_resolver, manager, termination_config=config
        )

    def close() -> None:
        from tfrecipe import compat

        try:
            compat.stop_preemption_watchers(handler)
        finally:  # the signal handlers and the scratch directory go back even where that failed
            restore_handler()
            _remove(scratch)

    return Watcher(handler.save_checkpoint_if_preempted, close)


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


_GCE_METADATA_ENV = "GCE_METADATA_IP"  # where TensorFlow's GCE probe looks


def on_gce_vm() -> bool:
    """Whether this machine is a Google Compute Engine VM (its DMI product name says so)."""
    try:
        return "Google" in Path("/sys/class/dmi/id/product_name").read_text()
    except OSError:
        return False


@contextlib.contextmanager
def _no_gce_probe() -> Iterator[None]:
    """Off GCE, points the handler's metadata probe at a closed local port: refused at once
    instead of a 5 s timeout. On a GCE VM (or with GCE_METADATA_IP set) nothing changes."""
    if on_gce_vm() or _GCE_METADATA_ENV in os.environ:
        yield
        return
    os.environ[_GCE_METADATA_ENV] = "127.0.0.1:1"
    try:
        yield
    finally:
        os.environ.pop(_GCE_METADATA_ENV, None)
