"""py-spy's failure, as it prints it (with RUST_BACKTRACE=1 too: its environment's), said in one line with the fix
where it is a permission: a pod without CAP_SYS_PTRACE, a seccomp profile refusing process_vm_readv."""

from __future__ import annotations

from blackbox.adapters.pyspy import failure

# py-spy 0.4 as it failed on a process it was not allowed to read (seccomp refusing process_vm_readv, RUST_BACKTRACE=1)
REFUSED = """Error: Failed to get process executable name. Check that the process is running.

Caused by:
    0: Permission denied (os error 13)
    1: Permission denied (os error 13)

Stack backtrace:
   0: <E as anyhow::context::ext::StdError>::ext_context
   1: py_spy::python_process_info::PythonProcessInfo::new
  10: main
"""


def test_the_error_and_its_innermost_cause_without_the_backtrace() -> None:
    assert failure(REFUSED) == (
        "Failed to get process executable name. Check that the process is running: Permission denied (os error 13)"
    )


def test_an_error_without_causes_or_a_plain_line_is_kept_as_it_is() -> None:
    assert failure("Error: Operation not permitted (os error 1)\n") == "Operation not permitted (os error 1)"
    assert failure("some line\nlast line\n") == "last line"
    assert failure("") == ""
