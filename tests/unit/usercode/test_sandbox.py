"""Bounds on the user's code (``dtppo.usercode.sandbox``), each applied in a fresh interpreter of its own (they change
the process that applies them): a dead process's end in words, the output cap per job with its one notice, the
memory limit that fails a runaway allocation inside the process, and a forked copy stopped before it can answer.
Through the scoring pool and environment processes: tests/unit/usercode/test_pool_bounds.py."""

import signal
import subprocess
import sys
import textwrap

import pytest

from dtppo.usercode.sandbox import describe_exit


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60, check=False
    )


def test_a_dead_process_is_described_by_its_exit_code_or_signal():
    assert describe_exit(3) == "exit code 3" and describe_exit(0) == "exit code 0"
    assert describe_exit(-signal.SIGSEGV) == "signal 11 (SIGSEGV)" and describe_exit(-9) == "signal 9 (SIGKILL)"
    assert describe_exit(-200) == "signal 200" and describe_exit(None) == "no exit status"


def test_output_past_the_cap_is_dropped_with_one_notice_and_each_job_starts_afresh():
    done = _run(
        """
        import os, sys, time
        from dtppo.usercode.sandbox import OutputCap
        cap = OutputCap(10, "test output (x.max_print_bytes)")
        print("a" * 8); print("b" * 8, file=sys.stderr); print("c" * 8)
        cap.flush(); time.sleep(0.3)
        cap.start_job()
        os.write(1, b"0123456789abcdef")
        time.sleep(0.3)
        """
    )
    assert done.returncode == 0, done.stderr
    both = done.stdout + done.stderr
    notices = both.count("[dtppo: test output (x.max_print_bytes) past 10 bytes in this job is dropped]")
    assert notices == 2 and "c" * 8 not in both and "0123456789" in both and "abcdef" not in both


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA and /proc are Linux's")
def test_a_runaway_allocation_fails_inside_the_process_past_the_limit():
    done = _run(
        """
        from dtppo.usercode.sandbox import limit_memory
        small = bytearray(8 * 2**20)  # within 64 MiB of headroom
        limit_memory(64)
        try:
            bytearray(512 * 2**20)
        except MemoryError:
            print("refused")
        """
    )
    assert done.returncode == 0 and done.stdout.strip() == "refused", done.stderr


def test_a_forked_copy_exits_before_it_can_answer():
    done = _run(
        """
        import os
        from dtppo.usercode.sandbox import exit_if_forked
        serving = os.getpid()
        child = os.fork()
        exit_if_forked(serving)  # the copy exits here with status 0
        if child:
            os.waitpid(child, 0)
            print("answered once by", "serving" if os.getpid() == serving else "copy")
        """
    )
    assert done.returncode == 0 and done.stdout.splitlines() == ["answered once by serving"], done.stderr
