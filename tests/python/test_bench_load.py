# SPDX-License-Identifier: Apache-2.0
"""``python -m fastpersist.bench load`` and the save benchmark's ``--loops``: the result lines
that bench/checkpoint_vs_fio.py parses, the page-cache eviction they rely on, no files left."""

from __future__ import annotations

import os
import re

import pytest

torch = pytest.importorskip("torch")

RESULT = r"-- \d+\.\d\d GB, \d+\.\d\d secs, \d+\.\d\d GB/s$"


def _tag_lines(out: str, tag: str):
    return [line for line in out.splitlines() if line.startswith(tag + " -- ")]


def test_load_prints_a_line_per_loader_and_loop(tmp_path, capsys):
    from fastpersist.bench.__main__ import main

    rc = main(["load", "--mb_size", "3", "--loops", "2", "--folder", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.startswith("# python -m fastpersist.bench load"), "the reproducing command first"
    loaders = ["torch_load", "fastpersist_load"]
    try:
        import safetensors  # noqa: F401

        loaders.append("safetensors_load")
    except ImportError:
        assert re.search(r"^safetensors_load -- skipped: \S", out, re.M), out
    for tag in loaders:
        lines = _tag_lines(out, tag)
        assert len(lines) == 2, out
        for line in lines:
            assert re.match(f"^{tag} {RESULT}", line), line
    assert re.search(r"^# fastpersist_load / torch_load: best \d+\.\d\dx, median \d+\.\d\dx$",
                     out, re.M), out
    assert list(tmp_path.iterdir()) == []


def test_evict_drops_the_file_from_the_page_cache(tmp_path):
    from fastpersist.bench.loaders import cached_fraction, evict

    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(4 << 20))
    with open(path, "rb") as f:
        f.read()  # now cached
    before = cached_fraction(str(path))
    left = evict(str(path))
    if before > 0.9 and left > 0.5:
        pytest.skip("this filesystem keeps the pages (tmpfs?): fadvise cannot evict them")
    assert 0.0 <= left <= 0.05
    assert cached_fraction(str(tmp_path / "f.bin")) == left


def test_load_model_state_dict_round_trips(tmp_path, capsys):
    pytest.importorskip("transformers")
    from fastpersist.bench.__main__ import main

    # The loaders compare every loaded tensor with the saved one (torch.equal); tiny-t5 has
    # tied embeddings, which the safetensors copy must drop.
    rc = main(["load", "--model", "tiny-t5", "--loops", "1", "--folder", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert _tag_lines(out, "fastpersist_load") and _tag_lines(out, "torch_load"), out


def test_save_loops_rotate_and_repeat_every_tag(tmp_path, capsys):
    from fastpersist.bench.__main__ import main

    tags = ["test_ds_mock_save", "test_ds_aio_fast_save"]
    rc = main(["tensor", "--mb_size", "2", "--loops", "2", "--folder", str(tmp_path), "--only",
               *tags])
    out = capsys.readouterr().out
    assert rc == 0, out
    order = [line.split(" -- ")[0] for line in out.splitlines() if re.match(r"^\w+ -- ", line)]
    assert order == tags + tags[::-1], "each loop starts one mechanism later"
    stats = [line for line in out.splitlines() if "fastpersist stats" in line]
    assert stats and all("pinned_bytes: 67108864" in line for line in stats), stats
    assert list(tmp_path.iterdir()) == []
