"""What a container runtime does in a new pod's namespaces before it executes the container's command (tests/pods.py
starts it as the first process of the pod's PID namespace, so the command it executes is PID 1): the pod's hostname,
its hosts file (the operators' service names, which only the pods resolve), its mounted Secrets, then no
CAP_SYS_PTRACE and a seccomp filter that refuses ptrace, process_vm_readv and process_vm_writev (the runtimes' default
profile without that capability). With --exec it only restricts itself and executes the command: a process
`kubectl exec` starts in a running pod. Stdlib only.

    pod_init.py [--hostname NAME --hosts FILE --secret SRC:DIR ...] [--exec] -- COMMAND [ARG ...]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import shutil
import socket
import struct
import sys

LIBC = ctypes.CDLL(None, use_errno=True)
MS_BIND, MS_NOSUID, MS_NODEV = 4096, 2, 4
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 24, 38, 22
SECCOMP_MODE_FILTER = 2
CAP_SYS_PTRACE = 19
# (audit arch, the system call numbers of ptrace, process_vm_readv, process_vm_writev)
ARCHES = {"x86_64": (0xC000003E, (101, 310, 311)), "aarch64": (0xC00000B7, (117, 270, 271))}
RET_ALLOW, RET_EPERM = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW; SECCOMP_RET_ERRNO | EPERM


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int) -> None:
    _check(LIBC.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags, None), target)


def set_up(hostname: str, hosts: str, secrets: list[str]) -> None:
    """The pod's own names and files, in its UTS and mount namespaces."""
    socket.sethostname(hostname)
    _mount(hosts, "/etc/hosts", None, MS_BIND)
    # a tmpfs over /run for the Secrets' mount points (/var/run/secrets/…), as the kubelet mounts them: nothing of
    # the host's /run is seen in the pod
    _mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV)
    for spec in secrets:
        source, target = spec.split(":", 1)
        os.makedirs(target, exist_ok=True)
        for name in os.listdir(source):
            shutil.copyfile(os.path.join(source, name), os.path.join(target, name))


def restrict() -> None:
    """No CAP_SYS_PTRACE for what this executes, and no ptrace or process_vm_readv/writev at all."""
    _check(LIBC.prctl(PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0), "dropping CAP_SYS_PTRACE")
    _check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    arch, refused = ARCHES[platform.machine()]
    # classic BPF over struct seccomp_data {int nr; u32 arch; ...}: another arch is allowed through (none runs here)
    code = [(0x20, 0, 0, 4), (0x15, 0, len(refused) + 2, arch), (0x20, 0, 0, 0)]  # ld arch; jeq; ld nr
    code += [(0x15, len(refused) - i, 0, nr) for i, nr in enumerate(refused)]  # jeq nr -> EPERM
    code += [(0x06, 0, 0, RET_ALLOW), (0x06, 0, 0, RET_EPERM)]
    program = b"".join(struct.pack("HBBI", *insn) for insn in code)
    buffer = ctypes.create_string_buffer(program)
    fprog = struct.pack("HxxxxxxP", len(code), ctypes.addressof(buffer))
    _check(LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0), "seccomp")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hostname")
    parser.add_argument("--hosts")
    parser.add_argument("--secret", action="append", default=[])
    parser.add_argument("--exec", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.exec:
        set_up(args.hostname, args.hosts, args.secret)
    restrict()
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main())
