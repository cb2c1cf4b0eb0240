"""`runtime.child.in_child`: the call runs in another process, what the function imports stays there, its
result and its errors come back, it logs as the entry points do, and it does not outlive a killed parent."""

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.waiting import wait_until
from verl_search.runtime.child import in_child

from tests.runtime import child_targets

TARGETS = "tests.runtime.child_targets"


def test_the_call_runs_in_another_process_that_alone_imports_what_the_function_imports(capfd):
    pid = in_child(child_targets.pid_and_logs, "hello from the child")
    assert pid != os.getpid()
    assert child_targets.HEAVY not in sys.modules  # imported inside the function, in the child only
    # the entry points' logging (`exits.LOG_FORMAT`) in the child, on this process's stderr
    assert "INFO verl_search.tests.child: hello from the child" in capfd.readouterr().err


def test_a_module_level_function_is_accepted():
    assert in_child(os.getpid) != os.getpid()


def test_the_childs_error_is_raised_here():
    with pytest.raises(ValueError, match="value 3 is refused"):
        in_child(child_targets.fails, 3)


def _alive(pid: int) -> bool:
    """`pid` runs (an exited child nobody reaped yet, a zombie, counts as ended)."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _pid_in(pid_file) -> int | None:
    """The pid `child_targets.sleeps` wrote, once the file holds it whole."""
    try:
        text = pid_file.read_text()
    except FileNotFoundError:
        return None
    return int(text) if text.strip().isdigit() else None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")
def test_a_killed_parent_takes_its_child_along(tmp_path):
    pid_file = tmp_path / "child.pid"
    script = (f"from verl_search.runtime.child import in_child; from {TARGETS} import sleeps; "
              f"in_child(sleeps, {str(pid_file)!r}, 120)")
    # its stderr to a file: the killed parent's multiprocessing resource tracker reports the queues it left
    with open(tmp_path / "parent.log", "w") as log:
        parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stderr=log)
    child = wait_until(lambda: _pid_in(pid_file), 60, "the child to write its pid", watch={"the parent": parent},
                       details=lambda: (tmp_path / "parent.log").read_text()[-2000:])
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    wait_until(lambda: not _alive(child), 20, f"the child {child} to end after its parent was killed")
