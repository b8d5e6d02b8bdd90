# SPDX-License-Identifier: Apache-2.0
"""The progress bar as Python draws it (``_core.ProgressBar``: the CLI's C++ bar,
src/common/progress.h, writing into a Python stream) and the byte counts
``fastpersist.convert.convert(progress=...)`` reports: every number must be a measured one (file
sizes, bytes read and written), starting at 0 and ending at the total.

The CLI's ``--progress`` / ``--no-progress`` are tested with the other convert tests in
test_cli_checkpoint.py.
"""

from __future__ import annotations

import io
import sys
import threading
from pathlib import Path
from typing import Dict, List, Tuple

import torch

import fastpersist
from fastpersist._core import ProgressBar, format_bytes_short, format_eta
from fastpersist.convert import convert

GiB = 1 << 30
MiB = 1 << 20


def test_render_is_the_cli_line():
    assert (ProgressBar.render("convert write ckpt/step-00000001", int(1.2 * GiB), int(3.1 * GiB),
                               0.8)
            == "convert write ckpt/step-00000001  1.2 GiB / 3.1 GiB  [=========>              ]"
               "  1.5 GiB/s  ETA 0:02")
    # Nothing yet: no arrow and no rate; a total of 0 is complete.
    assert ProgressBar.render("x", 0, 10, 1.0) == "x  0 B / 10 B  [                        ]"
    assert ProgressBar.render("x", 0, 0, 0.0) == "x  0 B / 0 B  [========================]"
    assert ProgressBar.render("x", 10, 10, 0.0, bar_width=4) == "x  10 B / 10 B  [====]"
    assert [format_bytes_short(n) for n in (0, 1023, 1024, 1536, 5 * MiB, 2.5 * GiB)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "5.0 MiB", "2.5 GiB"]
    assert [format_eta(s) for s in (6.2, 754, 3723, -1)] == ["0:07", "12:34", "1:02:03", "?"]


def test_bar_redraws_at_most_every_interval_and_ends_the_line():
    out = io.StringIO()
    bar = ProgressBar("convert read m.pt", True, out, min_interval=3600)
    for done in range(0, 101, 10):
        bar.update(done, 100)
    assert out.getvalue() == "\rconvert read m.pt  0 B / 100 B  [                        ]"
    bar.finish()
    frames = out.getvalue().split("\r")
    assert len(frames) == 3 and frames[2].startswith("convert read m.pt  100 B / 100 B  [=")
    assert out.getvalue().endswith("\n")
    bar.finish()
    bar.update(5, 100)
    assert out.getvalue().count("\n") == 1  # finished: idempotent, later updates ignored


def test_bar_blanks_its_line_when_cleared_and_disabled_bars_write_nothing():
    out = io.StringIO()
    bar = ProgressBar("convert read m.pt", True, out)
    bar.update(1, 2)
    width = len(out.getvalue()) - 1
    bar.finish(clear=True)
    assert out.getvalue().endswith("\r" + " " * width + "\r")
    quiet = io.StringIO()
    bar = ProgressBar("convert read m.pt", False, quiet)
    bar.update(1, 2)
    bar.finish()
    assert quiet.getvalue() == "" and not bar.enabled
    unused = io.StringIO()
    ProgressBar("x", True, unused).finish()
    assert unused.getvalue() == ""  # nothing drawn: the terminal is left alone


def test_bar_draws_into_sys_stderr_by_default(capsys):
    bar = ProgressBar("convert read m.pt", True)
    bar.update(5, 10)
    bar.finish()
    err = capsys.readouterr().err
    assert err.startswith("\rconvert read m.pt  5 B / 10 B  [============>") and err.endswith("\n")


def test_bar_updated_from_many_threads_draws_whole_frames():
    # update() releases the GIL around the bar's mutex and takes it back to write: Python
    # threads drawing one bar must neither deadlock nor interleave frames.
    out = io.StringIO()
    bar = ProgressBar("x", True, out, min_interval=0)

    def run(t: int) -> None:
        for i in range(200):
            bar.update(t * 200 + i, 800)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    bar.finish()
    frames = out.getvalue().split("\r")[1:]
    assert len(frames) >= 2 and all(f.startswith("x  ") for f in frames)
    assert out.getvalue().endswith("\n") and out.getvalue().count("\n") == 1


def test_a_failing_stream_never_fails_the_operation(monkeypatch):
    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise ValueError("I/O operation on closed file")

    reported: List[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))
    bar = ProgressBar("x", True, Closed())
    bar.update(1, 2)  # reported as unraisable, not raised
    bar.finish()
    # Each frame (the update's, the final one, the line end) is reported, none raised.
    assert len(reported) == 3
    assert {str(e) for e in reported} == {"I/O operation on closed file"}


Events = Dict[Tuple[str, str], List[Tuple[int, int]]]


def run_convert(src: Path, dst: Path, **kwargs) -> Events:
    events: Events = {}
    convert(str(src), str(dst), progress=lambda phase, path, done, total:
            events.setdefault((phase, path), []).append((done, total)), **kwargs)
    return events


def assert_measured(events: List[Tuple[int, int]], final: int, at_least: int = 2) -> None:
    """Starts at 0 (of a known total), never goes back, ends complete at `final` bytes."""
    assert len(events) >= at_least, events
    assert events[0][0] == 0
    dones = [d for d, _ in events]
    assert dones == sorted(dones), events
    assert all(d <= t for d, t in events), events
    assert events[-1] == (final, final), events


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir())


def test_convert_reports_the_bytes_it_reads_and_writes(tmp_path):
    # 120 MiB: more than one 64 MiB read chunk / checkpoint read batch, so there is progress
    # between the start and the end of each read.
    g = torch.Generator().manual_seed(3)
    original = {f"layer.{i}.weight": torch.randn(10 * MiB, generator=g) for i in range(3)}
    pt = tmp_path / "model.pt"
    torch.save(original, pt)

    ckpt = tmp_path / "ckpts" / "imported"
    events = run_convert(pt, ckpt)
    assert list(events) == [("read", str(pt)), ("write", str(ckpt))]
    assert_measured(events["read", str(pt)], pt.stat().st_size, at_least=3)
    # A checkpoint save has no byte counter: its start, then every byte of the committed files.
    assert_measured(events["write", str(ckpt)], dir_bytes(ckpt))
    assert events["write", str(ckpt)][0] == (0, 120 * MiB)

    st = tmp_path / "model.safetensors"
    events = run_convert(ckpt, st)
    assert_measured(events["read", str(ckpt)], 120 * MiB, at_least=4)  # one batch per tensor
    assert_measured(events["write", str(st)], st.stat().st_size, at_least=4)  # per tensor

    back = tmp_path / "back.pt"
    events = run_convert(st, back)
    assert_measured(events["read", str(st)], st.stat().st_size, at_least=3)
    assert_measured(events["write", str(back)], back.stat().st_size, at_least=3)
    restored = torch.load(back, weights_only=True)
    assert set(restored) == set(original)
    assert all(torch.equal(restored[k], original[k]) for k in original)


def test_legacy_torch_files_report_their_size_once_loaded(tmp_path):
    # torch.load reads a non-zip file itself: there is nothing to measure until it returns.
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(1000)}, legacy, _use_new_zipfile_serialization=False)
    out = tmp_path / "w.safetensors"
    events = run_convert(legacy, out)
    size = legacy.stat().st_size
    assert events["read", str(legacy)] == [(0, size), (size, size)]
    assert torch.equal(fastpersist.load_safetensors(out)["w"], torch.ones(1000))


def test_without_a_callback_the_result_is_the_same(tmp_path):
    g = torch.Generator().manual_seed(4)
    state = {"a": torch.randn(100, generator=g), "b": torch.arange(7)}
    pt = tmp_path / "m.pt"
    torch.save(state, pt)
    for name in ("quiet", "reported"):
        out = tmp_path / f"{name}.safetensors"
        if name == "quiet":
            convert(str(pt), str(out))
        else:
            run_convert(pt, out)
        loaded = fastpersist.load_safetensors(out)
        assert all(torch.equal(loaded[k], state[k]) for k in state)
    assert (tmp_path / "quiet.safetensors").read_bytes() == (
        tmp_path / "reported.safetensors").read_bytes()
