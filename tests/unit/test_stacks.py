"""Reading faulthandler's text dumps and finding the user's frame."""

from __future__ import annotations

from blackbox.adapters.stacks import main_thread, parse_faulthandler

DUMP = """Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/work/blackbox/_recorder/recorder.py", line 273 in _liveness_loop

Current thread 0x00007f0000000001 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3245 in all_reduce
  File "/home/me/train.py", line 88 in step
  File "/home/me/train.py", line 120 in main
"""


def test_two_dumps_in_one_file_and_the_user_frame() -> None:
    names = {"0x00007f0000000001": "MainThread", "0x00007f0000000002": "blackbox-liveness"}
    dumps = parse_faulthandler(DUMP + DUMP, names)
    assert len(dumps) == 2 and [len(d) for d in dumps] == [2, 2]
    main = main_thread(dumps[-1])
    assert main is not None and main.current and main.name == "MainThread"
    assert [f.function for f in main.frames] == ["main", "step", "all_reduce"]  # outermost first
    top = main.top_user_frame()
    assert top is not None and top.describe() == "step (train.py:88)"


def test_garbage_is_no_stack() -> None:
    assert parse_faulthandler("Segmentation fault\n\n<no Python frame>\n") == []
