"""Starting `skyhive daemon` for this process, or attaching to a running one."""

import os
import shutil
import subprocess
import tempfile
import time

from .errors import DaemonError

START_TIMEOUT = 30.0


def find_binary(binary=None):
    """The skyhive binary: binary, else $SKYHIVE_BIN, else `skyhive` on PATH."""
    path = binary or os.environ.get("SKYHIVE_BIN") or shutil.which("skyhive")
    if not path:
        raise DaemonError(
            "the skyhive binary was not found: build it (make build in the repository, then put "
            "bin/skyhive on PATH), set SKYHIVE_BIN to its path, or pass binary=...")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise DaemonError(f"{path} is not an executable file: give the skyhive binary (SKYHIVE_BIN or binary=...)")
    return path


class Daemon:
    """A daemon this process started (socket=None) or one it attaches to.

    A started daemon serves this process only (`skyhive daemon --once`):
    it listens on a socket in a private temporary directory, logs to a file
    there, and exits when the session ends, also if this process dies."""

    def __init__(self, socket=None, binary=None, start_timeout=START_TIMEOUT):
        self.proc = None
        self.log_path = None
        self._dir = None
        if socket is not None:
            self.socket = socket
            return
        exe = find_binary(binary)
        self._dir = tempfile.mkdtemp(prefix="skyhive-")  # mode 0700
        self.socket = os.path.join(self._dir, "daemon.sock")
        self.log_path = os.path.join(self._dir, "daemon.log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [exe, "daemon", "--once", "--socket", self.socket],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + start_timeout
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None:
                raise DaemonError(f"{exe} daemon exited with status {self.proc.returncode}{self._hint()}{self.describe()}")
            if time.monotonic() > deadline:
                self.stop()
                raise DaemonError(f"{exe} daemon did not open its socket within {start_timeout:.0f} s{self.describe()}")
            time.sleep(0.02)

    def _hint(self):
        if "unknown command" in self.log_tail():
            return ": this skyhive binary is too old to serve PyTorch (no `daemon` command); build the current one"
        return ""

    def log_tail(self, n=2000):
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def describe(self):
        """The end of the daemon's log, for error messages."""
        tail = self.log_tail().strip()
        if not tail:
            return ""
        return f"\n--- daemon log ({self.log_path}) ---\n{tail}"

    def stop(self, timeout=30.0):
        """Waits for a started daemon to exit (it does when its session closes), then kills it."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.returncode == 0 and self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)  # a failed daemon's log stays for the user
            self._dir = self.log_path = None
