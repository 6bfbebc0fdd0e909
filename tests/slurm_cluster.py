"""A real single-node Slurm cluster for tests: Debian's munged, slurmctld and slurmd on loopback.

Everything lives in one temporary folder (munge key and socket, slurm.conf, state, spool,
logs, pid files); the daemons run in the foreground as children of the test process, so
stopping them is a plain terminate/wait and nothing outlives the session. The configuration
needs no systemd and no cgroups (proctrack/linuxproc, task/none), so it also runs in a bare
chroot. Two or more partitions over the one node stand for two or more systems.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from typing_extensions import Self

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "srun", "scontrol")


def missing_programs() -> list[str]:
    return [p for p in DAEMONS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ClusterError(RuntimeError):
    pass


@dataclass
class SlurmCluster:
    root: Path
    partitions: tuple[str, ...]
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client (sbatch, squeue, submitit) needs to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def _client_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    # --- start ---------------------------------------------------------------------------

    def start(self) -> Self:
        try:
            self._start_munge()
            self._write_conf()
            self._spawn("slurmctld", [_program("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._wait(lambda: self._ok(["scontrol", "ping"], "is UP"), "slurmctld answering")
            self._spawn("slurmd", [_program("slurmd"), "-D", "-f", str(self.conf), "-N", "localhost"])
            self._wait(lambda: self._ok(["sinfo", "-h", "-N", "-o", "%T"], "idle"), "the node idle")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self) -> None:
        mdir = self.root / "munge"
        mdir.mkdir(mode=0o700, parents=True)
        key = mdir / "munge.key"
        subprocess.run([_program("mungekey"), "--create", f"--keyfile={key}"], check=True,
                       capture_output=True)
        key.chmod(0o600)
        self.socket = mdir / "munge.socket"
        self._spawn("munged", [_program("munged"), "--foreground", "--force", f"--socket={self.socket}",
                               f"--key-file={key}", f"--log-file={mdir / 'munged.log'}",
                               f"--pid-file={mdir / 'munged.pid'}", f"--seed-file={mdir / 'munged.seed'}"])
        self._wait(self.socket.exists, "the munge socket")

    def _write_conf(self) -> None:
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir()
        log = self.root / "log"
        lines = [
            "ClusterName=benanzatest",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"AuthInfo=socket={self.socket}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={log / 'slurmctld.log'}",
            f"SlurmdLogFile={log / 'slurmd.log'}",
            # no systemd, no cgroups: what a bare chroot or container offers
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "MinJobAge=3600",  # keep finished jobs visible to scontrol/squeue for the whole test
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "InactiveLimit=0",
            "KillWait=5",
            f"NodeName=localhost NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
        ]
        for i, p in enumerate(self.partitions):
            lines.append(f"PartitionName={p} Nodes=localhost MaxTime=INFINITE State=UP"
                         + (" Default=YES" if i == 0 else ""))
        self.conf.write_text("\n".join(lines) + "\n")
        # slurmd 22.05 loads a cgroup plugin even when nothing uses cgroups, and autodetecting its
        # version fails where /sys/fs/cgroup is not mounted (a chroot): name one, it stays idle.
        (self.root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        out = (self.root / f"{name}.out").open("wb")
        self.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self._client_env(),
                                            stdin=subprocess.DEVNULL)
        out.close()

    def _ok(self, cmd: list[str], needle: str) -> bool:
        done = subprocess.run(cmd, capture_output=True, text=True, env=self._client_env(),
                              check=False)
        return done.returncode == 0 and needle in done.stdout

    def _wait(self, ready, what: str, seconds: float = 60.0) -> None:
        deadline = time.monotonic() + seconds
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise ClusterError(f"Slurm test cluster: no {what} "
                                   f"({'exited: ' + ', '.join(dead) if dead else 'timed out'})\n"
                                   + self.logs())
            time.sleep(0.2)

    def logs(self) -> str:
        parts = []
        for f in sorted(self.root.rglob("*")):
            if f.is_file() and (f.suffix in (".log", ".out")):
                tail = f.read_text(errors="replace").splitlines()[-15:]
                parts.append(f"--- {f.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    # --- stop ----------------------------------------------------------------------------

    def job_ids(self) -> list[str]:
        done = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                              env=self._client_env(), check=False)
        return done.stdout.split() if done.returncode == 0 else []

    def stop(self) -> None:
        """Cancels every job, waits for them to end, then stops the daemons (slurmd first)."""
        if "slurmd" in self.procs and self.procs["slurmd"].poll() is None:
            ids = self.job_ids()
            if ids:
                subprocess.run(["scancel", *ids], env=self._client_env(), capture_output=True, check=False)
                deadline = time.monotonic() + 30
                while self.job_ids() and time.monotonic() < deadline:
                    time.sleep(0.2)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def strays(self) -> list[str]:
        """Live processes started for this cluster (daemons, job steps, jobs): its slurm.conf
        is in their environment or command line. Empty once stop() has done its work."""
        mark = str(self.conf).encode()
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # already dead, waiting for its parent (init) to reap it
                if mark in (proc / "environ").read_bytes() or mark in (proc / "cmdline").read_bytes():
                    cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    found.append(f"{proc.name}: {cmdline}")
            except OSError:
                continue
        return found

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
