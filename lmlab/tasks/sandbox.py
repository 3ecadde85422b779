"""Running a compiler and the programs it builds outside this process, under limits: CPU
seconds, address space, file size, no core files (``resource.setrlimit`` in the child), a
wall-clock timeout that kills the child's whole process group, and a temporary folder removed
afterwards (the decompilation task's generator and verifier, :mod:`lmlab.tasks.decompile`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lmlab.utils.errors import LmlabError

MIB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What one child may use: ``cpu_seconds`` of CPU (then SIGXCPU/SIGKILL), ``memory_mib`` of
    address space, ``file_mib`` per written file, ``wall_seconds`` of real time."""

    cpu_seconds: int = 2
    memory_mib: int = 256
    file_mib: int = 16
    wall_seconds: float = 10.0


#: a compiler's limits (cc1 and ld want more room than the programs they build)
COMPILE_LIMITS = Limits(cpu_seconds=20, memory_mib=1024, file_mib=64, wall_seconds=60.0)
#: a compiled test program's
RUN_LIMITS = Limits(cpu_seconds=2, memory_mib=256, file_mib=1, wall_seconds=10.0)


@dataclass(frozen=True)
class Outcome:
    """A child's exit: ``returncode`` (negative: killed by that signal), its output, and whether
    a limit stopped it (``timed_out``: the wall clock; ``cpu_limit``: SIGXCPU or SIGKILL)."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def cpu_limit(self) -> bool:
        return self.returncode in (-signal.SIGXCPU, -signal.SIGKILL)

    @property
    def stopped(self) -> bool:
        """Stopped by a limit (time or CPU) rather than ending on its own."""
        return self.timed_out or self.cpu_limit


def _limiter(limits: Limits):
    """The child's ``preexec_fn``: its rlimits (POSIX only)."""
    import resource

    def apply() -> None:
        cpu = max(1, int(limits.cpu_seconds))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        memory = limits.memory_mib * MIB
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mib * MIB,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_limited(args: Sequence[str], cwd: str | Path, limits: Limits = RUN_LIMITS,
                stdin: str | None = None) -> Outcome:
    """Run ``args`` in ``cwd`` as a child under ``limits`` (its own process group, killed whole
    when the wall clock runs out); never raises for the child's failure."""
    if os.name != "posix":
        raise LmlabError("sandboxed compilation needs a POSIX system (resource limits)",
                         "run the decompilation task on Linux or macOS")
    process = subprocess.Popen(list(args), cwd=cwd, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=_limiter(limits), start_new_session=True,
                               env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                    "LC_ALL": "C"})
    try:
        out, err = process.communicate(stdin, timeout=limits.wall_seconds)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = process.communicate()
        return Outcome(process.returncode, out, err, timed_out=True)
    return Outcome(process.returncode, out, err)


@contextmanager
def scratch_folder(prefix: str = "lmlab-sandbox-") -> Iterator[Path]:
    """A temporary folder for one compilation, removed afterwards whatever happened."""
    with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as folder:
        yield Path(folder)


def compiler() -> str:
    """The machine's C compiler (``$CC``, else ``gcc``, else ``cc``), refused when none is
    installed."""
    for name in (os.environ.get("CC"), "gcc", "cc"):
        if name and (path := shutil.which(name)):
            return path
    raise LmlabError("no C compiler found (gcc or cc on PATH, or $CC)",
                     "install one (apt-get install gcc) or set CC")
