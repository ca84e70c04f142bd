"""A private one-node SLURM cluster (munged, slurmctld, slurmd) on this machine, for tests.

Everything lives in one directory: slurm.conf, the munge key and socket, state, spool, logs and
pid files; nothing in /etc or /run is used, so it neither needs nor disturbs a system SLURM.
`SLURM_CONF` in the returned environment points the client commands (sbatch, squeue, scancel,
scontrol) at it. Needs root (slurmd runs jobs as their user) and Debian's `slurm-wlm`.

    python tests/helpers/slurm.py DIR     # start one by hand; prints the env to use, stops on ^C
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
SBIN = Path("/usr/sbin")

# Short times so that tests wait little: a preempted job gets GRACE_S seconds to save, a
# cancelled one KILL_WAIT_S before SIGKILL, and a requeued job may start again after
# CRED_EXPIRE_S (SLURM's own default is 120 s; the minimum is 5).
GRACE_S = 30
KILL_WAIT_S = 30
CRED_EXPIRE_S = 5
CPUS = 2  # whatever the machine has (config_overrides): tests fill the node with 2 tasks
# Waits end on events (a job's state, a file), never on a budget a loaded machine can use up:
# this bound only keeps a hung cluster from holding a test run for ever.
HUNG_S = 1800
# The states a job leaves only by being submitted again.
ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


def missing() -> str | None:
    """Why no cluster can start here (None when it can)."""
    absent = [d for d in DAEMONS if not (SBIN / d).exists()]
    if absent or shutil.which("sbatch") is None:
        return (
            f"slurm-wlm is not installed ({', '.join(absent) or 'sbatch'} missing); "
            "apt-get install -y --no-install-recommends slurm-wlm"
        )
    if os.geteuid() != 0:
        return "a private SLURM cluster needs root (slurmd starts jobs as their user)"
    return None


def slurm_conf(root: Path, cpus: int = CPUS) -> str:
    """One node `localhost` with `cpus` CPUs; partitions `low` (default; preempted with requeue
    after a grace time) and `high` (preempts `low`). A preempted job gets its `--signal` (else
    SIGTERM) when the grace time starts: submitit's SIGUSR2, the sbatch script's SIGTERM."""
    return f"""\
ClusterName=tfrecipe-test
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket,cred_expire={CRED_EXPIRE_S}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait={KILL_WAIT_S}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=low Nodes=localhost Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime={GRACE_S}
PartitionName=high Nodes=localhost MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
"""


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclasses.dataclass
class Cluster:
    root: Path
    env: dict[str, str]

    def run(self, *args: str, check: bool = True, env: dict[str, str] | None = None) -> str:
        """A SLURM client command (sbatch, squeue, ...) against this cluster; its stdout."""
        done = subprocess.run(args, env=env or self.env, capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: {done.stderr}")
        return done.stdout.strip()

    def preempt(self, where: Path) -> None:
        """Submits a job of the high-priority partition that needs the whole node: it preempts
        what runs there (its log in `where`)."""
        high = ["--partition=high", f"--cpus-per-task={CPUS}", f"--output={where}/high-%j.out"]
        self.run("sbatch", *high, "--wrap=true")

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, ExitCode, ...)."""
        fields = {}
        for word in self.run("scontrol", "-o", "show", "job", job_id).split():
            key, _, value = word.partition("=")
            fields[key] = value
        return fields

    def wait_for(self, job_id: str, *states: str, timeout: float = HUNG_S) -> dict[str, str]:
        """Waits until the job is in one of `states`; returns its fields. (A requeued job starts
        again CRED_EXPIRE_S after its requeue at the earliest: hurrying it with StartTime=now
        gets it killed, "Job credential revoked".)"""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            if fields.get("JobState") in ENDED:  # it will not get there
                raise AssertionError(f"job {job_id} ended {fields.get('JobState')}, not {states}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is {fields.get('JobState')}, not {states}")
            time.sleep(0.2)

    def wait_while_running(self, job_id: str, predicate: Callable[[], bool]) -> None:
        """Until `predicate` holds, however long a loaded machine takes; fails as soon as the
        job ended without it (or after HUNG_S)."""
        deadline = time.monotonic() + HUNG_S
        while not predicate():
            state = self.job(job_id).get("JobState")
            if state in ENDED and not predicate():
                raise AssertionError(f"job {job_id} ended {state} before {predicate}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{predicate} still false after {HUNG_S} s (job {state})")
            time.sleep(0.2)

    @staticmethod
    def wait(predicate: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{predicate} still false after {timeout} s")
            time.sleep(0.2)


@contextlib.contextmanager
def cluster(root: Path, cpus: int = CPUS) -> Iterator[Cluster]:
    """Starts munged, slurmctld and slurmd in `root`; yields once the node is idle; stops the
    daemons (by the PIDs they were started with) and cancels leftover jobs afterwards."""
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (root / sub).mkdir(exist_ok=True)
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, cpus))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started: list[subprocess.Popen] = []
    try:
        started.append(_start_munged(root))
        _wait_for_path(root / "munge.socket")
        started.append(_start(["slurmctld", "-D", "-i"], root, env))
        started.append(_start(["slurmd", "-D", "-N", "localhost"], root, env))
        handle = Cluster(root, env)
        _wait_idle(handle, started)
        yield handle
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["scancel", "--full", "--user=root"], env=env, timeout=10)
        for process in reversed(started):
            _stop(process)


def _start_munged(root: Path) -> subprocess.Popen:
    key = root / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    return _start(
        [
            "munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={root}/munge.socket",
            f"--pid-file={root}/munged.pid",
            f"--log-file={root}/munged.log",
            f"--seed-file={root}/munged.seed",
        ],
        root,
        dict(os.environ),
    )


def _start(command: list[str], root: Path, env: dict[str, str]) -> subprocess.Popen:
    log = (root / f"{command[0]}.out").open("ab")
    return subprocess.Popen(
        [str(SBIN / command[0]), *command[1:]],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a ^C in the test run reaches pytest, not the daemons
    )


def _wait_for_path(path: Path, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.05)


def _wait_idle(handle: Cluster, started: list[subprocess.Popen], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for process in started:
            if process.poll() is not None:
                raise RuntimeError(
                    f"{process.args[0]} exited {process.returncode}; see {handle.root}"
                )
        state = handle.run("sinfo", "-h", "-o", "%T", check=False)
        if state.startswith("idle"):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the node is {state!r}, not idle; see {handle.root}")
        time.sleep(0.1)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


if __name__ == "__main__":
    import sys

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)  # ^C or kill: stop the daemons
    with cluster(Path(sys.argv[1]).resolve()) as running:
        print(f"export SLURM_CONF={running.env['SLURM_CONF']}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()
