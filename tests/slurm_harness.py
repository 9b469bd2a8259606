"""A real two-node Slurm cluster on this one machine, for tests (a library, not a test file).

``SlurmCluster`` installs Slurm when it is missing (Debian packages, as root), writes a
``slurm.conf`` into a fresh temporary folder and starts its own munged, slurmctld and two
slurmd (``node1`` and ``node2``, both ``NodeAddr=127.0.0.1``). Every client command runs
with ``SLURM_CONF`` pointing at that file, so nothing in ``/etc/slurm`` is read or changed,
and nothing outside the folder is started on a fixed port or socket::

    with SlurmCluster() as slurm:
        job = slurm.submit(script)
        slurm.wait_for(job, {"COMPLETED"}, timeout=60)

``stop()`` cancels the cluster's jobs, then ends every process it started and every
process that still carries its ``SLURM_CONF`` (left-over ``slurmstepd`` and job tasks), each
by PID, and removes the folder. The settings are Slurm 22.05's on Debian 12, as tested here
(slurm.conf(5) for each key; the comments below say why each value).

``slurm_user="slurm"`` runs slurmctld as Slurm's own user, as HyperPod's accounting scripts
configure it, and ``launch_after`` starts the daemons only after a delay, in the background, for
a node set up before its Slurm is up.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from ports import reserve_ports

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
ACCOUNTING_PACKAGES = ("slurmdbd", "mariadb-server")
NODES = ("node1", "node2")
TERMINAL_STATES = frozenset(
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


class SlurmUnavailable(RuntimeError):
    """Slurm cannot be installed or started on this machine (not root, not Debian, ...)."""


class Rejected(NamedTuple):
    """``sbatch`` refused a job: its exit status and output."""

    rc: int
    stdout: str
    stderr: str


class JobState(NamedTuple):
    """A job as ``scontrol show job -o`` describes it."""

    state: str
    """``JobState``, e.g. ``RUNNING`` or ``COMPLETED``."""
    restart_count: int
    """``Restarts``: how many times the job was requeued (``SLURM_RESTART_COUNT`` of its next run)."""
    exit_code: str
    """``ExitCode``, ``status:signal``, e.g. ``0:0``."""
    fields: dict[str, str]
    """Every ``key=value`` of the line."""


_PORTS_LOCK = threading.Lock()
_PORTS_GIVEN: set[int] = set()


def _reserve_ports(count: int) -> list[socket.socket]:
    """``count`` ports held by bound sockets (tests/ports.py), none handed out before in this
    process (clusters may start side by side in threads, and a port released here could be drawn
    again by the next caller)."""
    with _PORTS_LOCK:
        held: list[socket.socket] = []
        while len(held) < count:
            [s] = reserve_ports(1)
            if s.getsockname()[1] in _PORTS_GIVEN:
                s.close()
                continue
            held.append(s)
        _PORTS_GIVEN.update(s.getsockname()[1] for s in held)
        return held


def ensure_installed(extra: Sequence[str] = ()) -> None:
    """Install the Slurm and munge packages (and ``extra``: accounting's) unless their commands are on PATH."""
    commands = ["slurmctld", "munged", "sbatch", *(["slurmdbd", "mariadbd"] if extra else [])]
    if all(shutil.which(c) for c in commands):
        return
    if os.geteuid() != 0:
        raise SlurmUnavailable("Slurm is not installed and installing it needs root")
    if not shutil.which("apt-get"):
        raise SlurmUnavailable("Slurm is not installed and there is no apt-get to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Wait for another apt run instead of failing on its lock.
    packages = (*PACKAGES, *extra)
    install = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "--no-install-recommends", *packages]
    done = subprocess.run(install, env=env, capture_output=True, text=True)
    if done.returncode != 0:  # a fresh machine may have no package lists yet
        subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=300", "update"], env=env, capture_output=True)
        done = subprocess.run(install, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SlurmUnavailable(f"installing {' '.join(packages)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def _hardware() -> dict[str, int]:
    """CPUs, board/socket/core/thread layout and RealMemory (MiB) from ``slurmd -C``."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    fields = dict(re.findall(r"(\w+)=(\S+)", out.splitlines()[0]))
    return {
        key: int(fields[key])
        for key in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    }


class SlurmCluster:
    """A private Slurm cluster (``ClusterName=moeci``, partition ``ci`` (or ``partition``) of ``node1`` and ``node2``).

    Use it as a context manager, or call ``start()`` and ``stop()`` (``stop`` is idempotent
    and also runs at interpreter exit). Both nodes claim all of the machine's CPUs (the
    machine is oversubscribed, which is fine for tests) and half of its memory each, and
    carry the features ``efa`` and ``cpu``.
    """

    def __init__(
        self,
        *,
        startup_timeout: float = 60.0,
        job_env: dict[str, str] | None = None,
        etc_dir: Path | None = None,
        configless: bool = False,
        slurm_user: str = "root",
        launch_after_s: float | None = None,
        accounting: bool = False,
        partition: str = "ci",
    ):
        """``job_env`` is added to the environment of every command, and so of every job
        (sbatch exports it). By default ``OMP_NUM_THREADS=1``: both virtual nodes share this
        machine's cores, and torch ranks that each start one thread per core starve each other.

        ``etc_dir`` is where slurm.conf and plugstack.conf go (default: the cluster's folder),
        e.g. a node sandbox's ``opt/slurm/etc``, HyperPod's Slurm prefix. An existing
        plugstack.conf there is kept. ``configless`` runs the cluster as HyperPod's is: slurmctld
        with ``SlurmctldParameters=enable_configless``, and each slurmd with ``--conf-server``
        and no slurm.conf of its own, caching what slurmctld sends in its spool folder.

        ``slurm_user`` is ``SlurmUser``: ``root``, or ``slurm`` (Debian's package user), under
        which slurmctld drops to that user; its state and log folders are then that user's, and
        ``etc_dir`` must be readable by it (a pytest ``tmp_path`` is not: it sits in a 0700 folder).
        ``launch_after_s`` writes the configuration at once but starts the daemons that many
        seconds later, in the background (``wait_launched`` waits for them).

        ``accounting`` runs real accounting, as HyperPod's controller does by default: a MariaDB server of its
        own (a fresh data folder, its own port, grant tables skipped) and slurmdbd with ``slurmdbd.conf`` beside
        slurm.conf (owned by SlurmUser, mode 600, as slurmdbd requires), the cluster registered with sacctmgr
        before slurmctld starts. Debian's ``mariadb-server`` and ``slurmdbd`` are installed when missing."""
        self.startup_timeout = startup_timeout
        self.job_env = {"OMP_NUM_THREADS": "1"} if job_env is None else dict(job_env)
        self.etc_dir = etc_dir
        self.configless = configless
        self.partition = partition
        self.slurm_user = slurm_user
        self.launch_after_s = launch_after_s
        self.accounting = accounting
        self.ctld_port = 0
        self.dbd_port = 0
        self.mysql_port = 0
        self.dir: Path | None = None
        self.conf: Path | None = None
        self.env: dict[str, str] = {}
        self._procs: dict[str, subprocess.Popen] = {}
        self._stopped = False
        self._launcher: threading.Thread | None = None
        self._reserved: list[socket.socket] = []
        self._launch_error: BaseException | None = None
        self._launched = threading.Event()
        self._stopping = threading.Event()

    # -- life cycle -----------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> SlurmCluster:
        self._prepare()
        if self.launch_after_s is None:
            self._launch()
        else:
            self._launcher = threading.Thread(target=self._launch_later, daemon=True)
            self._launcher.start()
        return self

    def wait_launched(self, timeout: float = 120.0) -> None:
        """With ``launch_after_s``: wait until the daemons are up; raise what stopped them."""
        if self._launcher is not None:
            deadline = time.monotonic() + timeout
            while not self._launched.wait(0.2) and self._launcher.is_alive():
                if time.monotonic() > deadline:
                    raise SlurmUnavailable(f"the daemons were not up {timeout}s after launch_after_s")
        if self._launch_error is not None:
            raise self._launch_error

    def _launch_later(self) -> None:
        time.sleep(self.launch_after_s or 0)
        try:
            if not self._stopped:
                self._launch()
        except BaseException as error:  # handed to wait_launched, in the test's thread
            self._launch_error = error
            return
        # The daemons get SIGTERM when the thread that started them ends (PR_SET_PDEATHSIG follows
        # the thread, not the process), so this thread lives until stop().
        self._launched.set()
        self._stopping.wait()

    def _prepare(self) -> None:
        ensure_installed(ACCOUNTING_PACKAGES if self.accounting else ())
        if os.geteuid() != 0:
            raise SlurmUnavailable("starting munged as the munge user and slurmd needs root")
        try:
            munge = pwd.getpwnam("munge")
            owner = pwd.getpwnam(self.slurm_user)
        except KeyError as error:
            raise SlurmUnavailable(
                f"user {error} does not exist (are the munge and slurm packages installed?)"
            ) from error
        atexit.register(self.stop)
        self.dir = Path(tempfile.mkdtemp(prefix="moeci-slurm-"))
        self.dir.chmod(0o755)  # munged runs as munge and must reach its folder
        etc = self.etc_dir or self.dir
        etc.mkdir(parents=True, exist_ok=True)
        self.conf = etc / "slurm.conf"
        self.plugstack = etc / "plugstack.conf"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
        self.env.update(self.job_env)
        self.env["SLURM_CONF"] = str(self.conf)

        munge_dir = self.dir / "munge"
        munge_dir.mkdir()
        munge_dir.chmod(0o755)  # munged: "execute permissions for all required" on the socket folder
        self.munge_key = munge_dir / "munge.key"
        self.munge_key.write_bytes(os.urandom(1024))
        self.munge_key.chmod(0o600)
        for path in (munge_dir, self.munge_key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        self._munge = munge
        # munge's default socket name: a configless slurmd asks for its configuration before it
        # knows AuthInfo, so it looks for /run/munge/munge.socket.2 (see _spawn_slurmd).
        self.munge_socket = munge_dir / "munge.socket.2"
        for sub in ("ctld", "spool/node1", "spool/node2", "logs"):
            (self.dir / sub).mkdir(parents=True)
        # slurmctld writes its state, pid file and log as SlurmUser (a root-owned folder fails).
        for sub in ("ctld", "logs"):
            os.chown(self.dir / sub, owner.pw_uid, owner.pw_gid)
        if not self.plugstack.exists():
            self.plugstack.write_text("")  # no SPANK plugins from /etc/slurm
        self.conf.write_text(self._slurm_conf())
        if self.accounting:
            (self.dir / "mysql").mkdir()
            dbd_conf = etc / "slurmdbd.conf"
            dbd_conf.write_text(self._slurmdbd_conf())
            dbd_conf.chmod(0o600)
            os.chown(dbd_conf, owner.pw_uid, owner.pw_gid)
        if self.slurm_user != "root":
            readable = subprocess.run(["runuser", "-u", self.slurm_user, "--", "test", "-r", str(self.conf)])
            if readable.returncode != 0:
                raise SlurmUnavailable(f"{self.conf} is not readable by SlurmUser {self.slurm_user}: open its folders")

    def _launch(self) -> None:
        for reservation in self._reserved:
            reservation.close()
        munge = self._munge
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                f"--socket={self.munge_socket}",
                f"--key-file={self.munge_key}",
                f"--pid-file={self.munge_socket.parent / 'munged.pid'}",
                f"--log-file={self.munge_socket.parent / 'munged.log'}",
                f"--seed-file={self.munge_socket.parent / 'munged.seed'}",
            ],
            user=munge.pw_uid,
            group=munge.pw_gid,
            extra_groups=[],
        )
        self._wait(lambda: self.munge_socket.exists(), "munged to create its socket", "munged")
        if self.accounting:
            self._launch_accounting()
        self._spawn("slurmctld", ["slurmctld", "-D"])
        self._wait(lambda: "UP" in self.run("scontrol", "ping").stdout, "slurmctld to answer", "slurmctld")
        for node in NODES:
            self._spawn_slurmd(node)
        self._wait(self._nodes_idle, "node1 and node2 to become idle", "slurmd-node1")

    def restart_controller(self) -> None:
        """Stop slurmctld and start it again, as `systemctl restart slurmctld` does on a node: the settings that
        take effect only at its start (AccountingStorageEnforce) then hold."""
        controller = self._procs["slurmctld"]
        controller.terminate()
        controller.wait(timeout=60)
        self._spawn("slurmctld", ["slurmctld", "-D"])
        self._wait(lambda: "UP" in self.run("scontrol", "ping").stdout, "slurmctld to answer", "slurmctld")
        self._wait(self._nodes_idle, "node1 and node2 to become idle", "slurmctld")

    def stop(self) -> None:
        """Cancel every job, end every process this cluster started (by PID), remove its folder."""
        if self._stopped:
            return
        self._stopped = True
        for reservation in self._reserved:  # a cluster stopped before its launch
            reservation.close()
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            jobs = self.run("squeue", "-h", "-o", "%i", timeout=10).stdout.split()
            if jobs:
                self.run("scancel", *jobs, timeout=10)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and self.run("squeue", "-h", "-o", "%i", timeout=10).stdout.strip():
                    time.sleep(0.5)
        # slurmd before slurmctld (no "node not responding" noise), munged last.
        for name in [*(f"slurmd-{n}" for n in NODES), "slurmctld", "slurmdbd", "mariadbd", "munged"]:
            proc = self._procs.get(name)
            if proc is not None:
                _terminate(proc.pid, proc)
        # slurmstepd double-forks away from slurmd; it and any job task it left carry our SLURM_CONF.
        for pid in self.stray_pids():
            _terminate(pid)
        self._stopping.set()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.stop)

    def stray_pids(self) -> list[int]:
        """PIDs of processes (other than those started here) whose environment names this cluster's slurm.conf
        (or, under a configless slurmd, its folder)."""
        if self.conf is None:
            return []
        markers = {f"SLURM_CONF={self.conf}".encode(), f"MOE_CI_SLURM={self.dir}".encode()}
        mine = {p.pid for p in self._procs.values()} | {os.getpid()}
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in mine:
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if markers & set(environ.split(b"\0")):
                found.append(int(entry.name))
        return found

    # -- commands ------------------------------------------------------------------------------

    def run(self, *args: str, timeout: float = 30, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster; never raises on a non-zero status."""
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout, cwd=cwd)

    def submit(
        self, script_path: str | Path, extra_args: Sequence[str] = (), *, cwd: str | Path | None = None
    ) -> str | Rejected:
        """``sbatch --parsable [extra_args] script``: the job id, or ``Rejected(rc, stdout, stderr)``."""
        done = self.run("sbatch", "--parsable", *extra_args, str(script_path), cwd=cwd or Path(script_path).parent)
        if done.returncode != 0:
            return Rejected(done.returncode, done.stdout, done.stderr)
        return done.stdout.strip().split(";")[0]

    def job_state(self, job_id: str, *, tries: int = 5) -> JobState:
        """The job's state; a query that fails is asked again, up to ``tries`` times half a second apart (under
        load a poll once failed with nothing on stderr while the job ran on)."""
        for _ in range(tries):
            done = self.run("scontrol", "show", "job", "-o", str(job_id))
            if done.returncode == 0:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(
                f"scontrol show job {job_id} failed {tries} times, last with status {done.returncode}: "
                f"{done.stderr.strip()!r} {done.stdout.strip()!r}\n{self.log_tail(20)}"
            )
        fields = dict(re.findall(r"(?:^|\s)([A-Za-z:/]+)=(\S*)", done.stdout.strip()))
        return JobState(
            fields.get("JobState", "?"), int(fields.get("Restarts", "0")), fields.get("ExitCode", "?"), fields
        )

    def wait_for(self, job_id: str, states: Iterable[str], timeout: float, *, poll: float = 0.5) -> JobState:
        """Poll until the job's state is one of ``states``; a different final state or the timeout raises."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        while True:
            current = self.job_state(job_id)
            if current.state in wanted:
                return current
            if current.state in TERMINAL_STATES:
                raise AssertionError(f"job {job_id} ended {current.state}, not {sorted(wanted)}: {current.fields}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"job {job_id} still {current.state} after {timeout}s, not {sorted(wanted)}: {current.fields}"
                )
            time.sleep(poll)

    def requeue(self, job_id: str) -> None:
        done = self.run("scontrol", "requeue", str(job_id))
        if done.returncode != 0:
            raise RuntimeError(f"scontrol requeue {job_id} failed: {done.stderr.strip()}")

    def log_tail(self, lines: int = 40) -> str:
        """The end of every daemon log, for failure messages."""
        if self.dir is None:
            return ""
        out = []
        for log in sorted(self.dir.glob("logs/*")) + sorted(self.dir.glob("munge/*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"==> {log.name} <==\n" + "\n".join(text))
        return "\n".join(out)

    # -- internals -------------------------------------------------------------------------

    def _slurm_conf(self) -> str:
        assert self.dir is not None
        hw = _hardware()
        # Held until _launch starts the daemons, which may be launch_after_s later.
        self._reserved = _reserve_ports(1 + len(NODES) + (2 if self.accounting else 0))
        self.ctld_port, *node_ports = (s.getsockname()[1] for s in self._reserved)
        if self.accounting:
            *node_ports, self.dbd_port, self.mysql_port = node_ports
        d = self.dir
        lines = [
            "# Written by tests/slurm_harness.py: a private two-node cluster on one machine.",
            "ClusterName=moeci",
            "SlurmctldHost=localhost",  # the container's hostname may not resolve
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmUser={self.slurm_user}",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # A requeued job waits about cred_expire seconds before it may start again (default
            # 120); 5 works on Slurm 22.05 and saves time.
            f"AuthInfo=socket={self.munge_socket},cred_expire=5",
            f"StateSaveLocation={d / 'ctld'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'ctld' / 'slurmctld.pid'}",
            f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d / 'logs' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'logs'}/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            f"PlugStackConfig={self.plugstack}",
            # The cgroup plugins fail here and leave the node drained.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "EnforcePartLimits=ALL",  # impossible requests fail at submission, not pend forever
            "MailProg=/bin/true",
            "JobAcctGatherType=jobacct_gather/linux",
            *(
                [
                    "AccountingStorageType=accounting_storage/slurmdbd",
                    "AccountingStorageHost=localhost",
                    f"AccountingStoragePort={self.dbd_port}",
                    # slurm.conf(5): with slurmdbd, AccountingStoragePass names the munge socket to reach it by
                    # (AuthInfo's is not used for it).
                    f"AccountingStoragePass={self.munge_socket}",
                ]
                if self.accounting
                else ["AccountingStorageType=accounting_storage/none"]
            ),
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "MinJobAge=600",  # finished jobs stay visible to scontrol
            "KillWait=30",
            "InactiveLimit=0",
            "SchedulerParameters=sched_interval=5",
            *(["SlurmctldParameters=enable_configless"] if self.configless else []),
        ]
        cpus = (
            f"CPUs={hw['CPUs']} Boards={hw['Boards']} SocketsPerBoard={hw['SocketsPerBoard']} "
            f"CoresPerSocket={hw['CoresPerSocket']} ThreadsPerCore={hw['ThreadsPerCore']}"
        )
        memory = max(1, hw["RealMemory"] // len(NODES))
        for node, port in zip(NODES, node_ports):
            lines.append(
                f"NodeName={node} NodeAddr=127.0.0.1 Port={port} {cpus} RealMemory={memory} "
                "Feature=efa,cpu State=UNKNOWN"
            )
        lines.append(f"PartitionName={self.partition} Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _slurmdbd_conf(self) -> str:
        d = self.dir
        return (
            "\n".join(
                [
                    "# Written by tests/slurm_harness.py: slurmdbd over this cluster's own MariaDB.",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "DbdHost=localhost",
                    f"DbdPort={self.dbd_port}",
                    f"SlurmUser={self.slurm_user}",
                    f"PidFile={d / 'ctld' / 'slurmdbd.pid'}",
                    f"LogFile={d / 'logs' / 'slurmdbd.log'}",
                    "DebugLevel=info",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={self.mysql_port}",
                    "StorageUser=root",
                    "StorageLoc=slurm_acct_db",
                ]
            )
            + "\n"
        )

    def _launch_accounting(self) -> None:
        """MariaDB, then slurmdbd, then the cluster registered, as HyperPod's controller has them before slurmctld."""
        data = self.dir / "mysql"
        subprocess.run(
            ["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root", "--skip-test-db",
             "--auth-root-authentication-method=normal"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        self._spawn(
            "mariadbd",
            ["mariadbd", "--no-defaults", f"--datadir={data}", f"--socket={data / 'mysqld.sock'}",
             f"--port={self.mysql_port}", "--bind-address=127.0.0.1", "--user=root", "--skip-grant-tables",
             f"--pid-file={data / 'mariadbd.pid'}"],
        )  # fmt: skip
        self._wait(lambda: _accepts(self.mysql_port), "MariaDB to accept connections", "mariadbd")
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        self._wait(
            lambda: self.run("sacctmgr", "-n", "show", "cluster", timeout=10).returncode == 0,
            "slurmdbd to answer sacctmgr",
            "slurmdbd",
        )
        added = self.run("sacctmgr", "-i", "add", "cluster", "moeci", timeout=30)
        if added.returncode != 0 and "already exists" not in added.stdout + added.stderr:
            raise SlurmUnavailable(f"sacctmgr add cluster failed: {added.stdout}{added.stderr}")

    def _spawn_slurmd(self, node: str) -> None:
        argv = ["slurmd", "-D", "-N", node]
        if self.configless:
            # As on HyperPod's compute nodes (AWS's start_slurm.sh: slurmd --conf-server <controller>).
            # Before it has the configuration, slurmd authenticates through munge's default socket:
            # in a mount namespace of its own, the cluster's folder is bind-mounted over /run, so
            # that /run/munge/munge.socket.2 is this cluster's munged and nothing outside changes.
            argv = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                'mount --bind "$0" /run && exec "$@"',
                str(self.dir),
                *argv,
                "--conf-server",
                f"localhost:{self.ctld_port}",
            ]
            # No SLURM_CONF: the configuration comes from slurmctld alone. The marker lets stop()
            # find the job steps this slurmd leaves behind.
            env = {k: v for k, v in self.env.items() if k != "SLURM_CONF"} | {"MOE_CI_SLURM": str(self.dir)}
            self._spawn(f"slurmd-{node}", argv, env=env)
        else:
            self._spawn(f"slurmd-{node}", argv)

    def _spawn(self, name: str, argv: list[str], **kwargs) -> None:
        assert self.dir is not None
        out = open(self.dir / "logs" / f"{name}.console", "wb")
        try:
            kwargs.setdefault("env", self.env)
            self._procs[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                **kwargs,
            )
        finally:
            out.close()

    def _wait(self, ready, what: str, process: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while not ready():
            proc = self._procs[process]
            if proc.poll() is not None:
                raise SlurmUnavailable(
                    f"{process} exited with {proc.returncode} while waiting for {what}\n" + self.log_tail()
                )
            if time.monotonic() > deadline:
                raise SlurmUnavailable(
                    f"timed out after {self.startup_timeout}s waiting for {what}\n" + self.log_tail()
                )
            time.sleep(0.3)

    def _nodes_idle(self) -> bool:
        done = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return all(states.get(node) == "idle" for node in NODES)


def _accepts(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _die_with_parent() -> None:
    """In a daemon just before exec: get SIGTERM when the process that started it dies, so a
    test run that is killed (no finalizer, no atexit) does not leave the cluster behind.
    (Runs after Popen's user/group switch, which would otherwise clear the setting.)"""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _terminate(pid: int, proc: subprocess.Popen | None = None, grace: float = 10.0) -> None:
    """SIGTERM ``pid``, then SIGKILL it if it is still there after ``grace`` seconds."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc is not None:
            if proc.poll() is not None:
                return
        else:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            if _is_zombie(pid):
                return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if proc is not None:
        proc.wait(timeout=5)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
