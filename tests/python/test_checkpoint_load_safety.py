# SPDX-License-Identifier: Apache-2.0
"""Regression tests for the load crash of issue 10 and its class: a destination that is too
small, of another shape or dtype, a view into a larger tensor, non-contiguous, read-only, or
named with any character. Each case runs in its own interpreter, so a crash (the original bug
was a SIGSEGV from a heap overflow) fails that test instead of killing pytest."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


_CHILD = textwrap.dedent(r'''
    import json, mmap, sys, warnings
    import numpy as np
    import torch
    import fastpersist

    root, case = sys.argv[1], sys.argv[2]
    N = 1 << 22
    ODD_NAMES = ["a:b", "x|y", "p;q", "c,d", "new\nline", 'dq"uote', "it's", "\u00fcn\u00ef\u20ac", " ",
                 "\t", "a: checkpoint (3,), destination (4,)"]

    def save(state):
        with fastpersist.CheckpointManager(root, durable=False) as m:
            m.save(1, state)
        return fastpersist.CheckpointManager(root, durable=False)

    def check(cond, what):
        if not cond:
            raise AssertionError(what)

    def error_of(fn):
        try:
            fn()
        except Exception as e:  # the type and message are what the parent checks
            return [type(e).__name__, str(e)]
        return None

    out = {}
    saved = torch.arange(N, dtype=torch.float32)
    if case == "issue10_repro":
        mgr = save({"a:b": saved})
        dest = torch.zeros(16)
        got = mgr.load(into={"a:b": dest}, strict=False)
        check(torch.equal(got["a:b"], saved) and got["a:b"] is not dest, "loaded into new memory")
        check(torch.equal(dest, torch.zeros(16)), "destination untouched")
        out["strict"] = error_of(lambda: mgr.load(into={"a:b": dest}))
    elif case == "larger_shape":
        mgr = save({"a:b": saved})
        dest = torch.full((N + 5,), -1.0)
        got = mgr.load(into={"a:b": dest}, strict=False)
        check(torch.equal(got["a:b"], saved), "loaded")
        check(bool((dest == -1).all()), "destination untouched")
        out["strict"] = error_of(lambda: mgr.load(into={"a:b": dest}))
    elif case == "other_dtype_size":
        mgr = save({"w": saved})
        for dtype in (torch.float64, torch.float16, torch.bfloat16):
            dest = torch.zeros(N, dtype=dtype)
            got = mgr.load(into={"w": dest})
            check(got["w"] is dest and torch.equal(dest, saved.to(dtype)), str(dtype))
        dest = torch.zeros(N, dtype=torch.int32)
        out["to_int"] = error_of(lambda: mgr.load(into={"w": dest}))
        check(bool((dest == 0).all()), "refused before any write")
    elif case == "view_into_larger":
        mgr = save({"w": saved})
        big = torch.full((N + 3000,), -1.0)
        view = big[1000:1000 + N]
        got = mgr.load(into={"w": view})
        check(got["w"] is view and torch.equal(view, saved), "view filled")
        check(bool((big[:1000] == -1).all()) and bool((big[1000 + N:] == -1).all()), "outside unchanged")
        big.fill_(-1)
        small = big[1000:1016]
        got = mgr.load(into={"w": small}, strict=False)
        check(bool((big == -1).all()), "a too-small view writes nothing")
        check(torch.equal(got["w"], saved), "loaded into new memory instead")
        # A view whose claimed shape fits but whose storage ends early cannot be built in
        # torch; the capacity C++ gets is the storage's remainder from the view's first byte.
        tail = big[-16:]
        out["tail"] = error_of(lambda: mgr.load(into={"w": tail}))
        check(bool((big == -1).all()), "still nothing written")
    elif case == "non_contiguous":
        m = torch.randn(64, 48)
        mgr = save({"m": m, "v": saved[:1000].clone()})
        dest_t = torch.zeros(48, 64).t()          # transposed storage
        wide = torch.full((2000,), -7.0)
        dest_v = wide[::2]                        # every other element
        got = mgr.load(into={"m": dest_t, "v": dest_v})
        check(got["m"] is dest_t and torch.equal(dest_t, m), "transposed destination")
        check(torch.equal(dest_v, saved[:1000]) and bool((wide[1::2] == -7).all()), "strided destination")
        dest_b = torch.zeros(48, 64, dtype=torch.bfloat16).t()
        got = mgr.load(into={"m": dest_b, "v": dest_v}, max_memory=4096)
        check(torch.equal(dest_b, m.to(torch.bfloat16)), "strided, converted, streamed")
        expanded = torch.zeros(1, 48).expand(64, 48)
        out["expanded"] = error_of(lambda: mgr.load(into={"m": expanded, "v": dest_v}))
    elif case == "read_only_memory":
        mgr = save({"w": saved[:4096].clone()})
        mm = mmap.mmap(-1, 4096 * 4, prot=mmap.PROT_READ)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ro = torch.from_numpy(np.frombuffer(mm, dtype=np.float32))
        out["read_only"] = error_of(lambda: mgr.load(into={"w": ro}))
    elif case == "names_of_any_character":
        state = {n: torch.full((3,), float(i)) for i, n in enumerate(ODD_NAMES)}
        mgr = save(state)
        dest = {n: torch.zeros(3) for n in ODD_NAMES}
        got = mgr.load(into=dest)
        check(all(got[n] is dest[n] and torch.equal(dest[n], state[n]) for n in ODD_NAMES), "in place")
        wrong = {n: torch.full((4,), -1.0) for n in ODD_NAMES}
        out["strict"] = error_of(lambda: mgr.load(into=wrong))
        got = mgr.load(into=wrong, strict=False)
        check(all(torch.equal(got[n], state[n]) for n in ODD_NAMES), "non-strict loads new memory")
        check(all(bool((wrong[n] == -1).all()) for n in ODD_NAMES), "mismatched untouched")
        got = mgr.load(keys=[ODD_NAMES[0], ODD_NAMES[-1]])
        check(sorted(got) == sorted([ODD_NAMES[0], ODD_NAMES[-1]]), "selection by odd names")
    print(json.dumps(out))
''')


def _run(tmp_path, case):
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "root"), case],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"{case}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_issue10_repro_destination_too_small_does_not_crash(tmp_path):
    out = _run(tmp_path, "issue10_repro")
    kind, msg = out["strict"]
    assert kind == "ValueError"
    assert "shape mismatch: a:b: checkpoint (4194304,), destination (16,)" in msg


def test_destination_larger_than_the_tensor_is_a_mismatch_not_a_write(tmp_path):
    kind, msg = _run(tmp_path, "larger_shape")["strict"]
    assert kind == "ValueError" and "destination (4194309,)" in msg


def test_destination_of_another_dtype_size_is_converted_or_refused(tmp_path):
    kind, msg = _run(tmp_path, "other_dtype_size")["to_int"]
    assert kind == "ValueError" and "cannot load tensor 'w' (F32) into a destination of I32" in msg


def test_view_into_a_larger_tensor_writes_only_its_extent(tmp_path):
    kind, msg = _run(tmp_path, "view_into_larger")["tail"]
    assert kind == "ValueError" and "shape mismatch" in msg


def test_non_contiguous_destinations_are_filled_element_by_element(tmp_path):
    kind, msg = _run(tmp_path, "non_contiguous")["expanded"]
    assert kind == "ValueError" and "destination of 'm'" in msg
    assert "repeat" in msg or "overlap" in msg


def test_read_only_destination_is_refused(tmp_path):
    kind, msg = _run(tmp_path, "read_only_memory")["read_only"]
    assert kind == "ValueError" and "not writable" in msg


def test_names_of_any_character_strict_and_non_strict(tmp_path):
    kind, msg = _run(tmp_path, "names_of_any_character")["strict"]
    assert kind == "ValueError"
    for name in ["a:b", "x|y", "p;q", "c,d", "new\nline", 'dq"uote', "it's", "\u00fcn\u00ef\u20ac"]:
        assert f"{name}: checkpoint (3,), destination (4,)" in msg, name
