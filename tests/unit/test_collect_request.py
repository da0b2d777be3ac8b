"""The request `blackbox collect --preemption` leaves beside its SIGUSR1, as the supervisor reads it: only its own
user's fresh regular file with a known kind counts; anything else is a plain "collect now"; each is read once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from blackbox._recorder import protocol as P
from blackbox.collect import delegate


def write(run_dir: Path, body: object, age_s: float = 0.0) -> Path:
    path = run_dir / P.COLLECT_REQUEST
    path.write_text(json.dumps(body))
    if age_s:
        st = path.stat()
        os.utime(path, (st.st_atime - age_s, st.st_mtime - age_s))
    return path


def test_a_fresh_preemption_request_is_taken_once(tmp_path: Path) -> None:
    path = write(tmp_path, {"kind": "preemption", "pid": 12})
    assert delegate.take_request(str(tmp_path)) == delegate.PREEMPTION
    assert not path.exists()
    assert delegate.take_request(str(tmp_path)) == delegate.MANUAL  # the next SIGUSR1 is a plain one


@pytest.mark.parametrize("body", [{"kind": "shutdown"}, {"kind": 1}, ["preemption"], "preemption"])
def test_an_unknown_request_is_a_plain_collect_now(tmp_path: Path, body: object) -> None:
    path = write(tmp_path, body)
    assert delegate.take_request(str(tmp_path)) == delegate.MANUAL and not path.exists()


def test_a_stale_request_is_not_the_signals(tmp_path: Path) -> None:
    # its asker gave up long ago: a later "collect now" (a user's SIGUSR1) is not taken for a preStop hook
    write(tmp_path, {"kind": "preemption"}, age_s=delegate.REQUEST_MAX_AGE_S + 5)
    assert delegate.take_request(str(tmp_path)) == delegate.MANUAL


def test_a_link_or_another_users_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"kind": "preemption"}))
    (tmp_path / P.COLLECT_REQUEST).symlink_to(target)
    assert delegate.take_request(str(tmp_path)) == delegate.MANUAL
    assert target.exists() and not (tmp_path / P.COLLECT_REQUEST).is_symlink()  # the link removed, not its target
    if os.geteuid() == 0:
        path = write(tmp_path, {"kind": "preemption"})
        os.chown(path, 4321, 4321)
        assert delegate.take_request(str(tmp_path)) == delegate.MANUAL and not path.exists()
