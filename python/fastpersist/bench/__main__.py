# SPDX-License-Identifier: Apache-2.0
"""``python -m fastpersist.bench {tensor,model,roundtrip,load,peers,deepspeed}``: see the package docstring."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

import torch

from .. import serialization
from . import deepspeed_save, loaders, models, peers_cli, savers


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--folder", required=True, help="I/O folder (e.g. an NVMe mount)")
    p.add_argument("--gpu", action="store_true", help="use GPU tensors (needs CUDA)")
    p.add_argument("--io_buffer_mb", type=int, default=64, help="pinned staging MiB (default 64)")
    p.add_argument("--single_io_buffer", action="store_true", help="disable double buffering")
    p.add_argument("--no-statistics", dest="statistics", action="store_false",
                   help="do not print the writer's statistics")
    p.add_argument("--zipfile", action="store_true", help="torch zipfile format (default: legacy)")
    p.add_argument("--only", nargs="*", default=None, metavar="TAG",
                   help="run only these tags (e.g. test_save_fsync test_ds_aio_fast_save)")
    p.add_argument("--loops", type=int, default=1,
                   help="run every tag this many times, in an order that rotates each loop "
                        "(one result line per tag and loop; default 1)")
    p.add_argument("--rotate", type=int, default=0, metavar="K",
                   help="start the first loop K tags later (bench/checkpoint_vs_fio.py uses it "
                        "to vary the order across runs)")
    p.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="do not run the first tag once, untimed, before measuring (that first "
                        "save pays for faulting in the state: without the warm-up, the first "
                        "line of a run reads low)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fastpersist.bench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tensor", help="save one uint8 tensor of --mb_size MiB")
    _common(t)
    t.add_argument("--mb_size", type=int, required=True, help="tensor size in MiB")
    for name in ("model", "roundtrip"):
        m = sub.add_parser(name, help="save a Hugging Face model" if name == "model"
                           else "save, load back and compare the model's outputs")
        _common(m)
        m.add_argument("--model", required=True, choices=sorted(models.MODELS))
        m.add_argument("--optimizer", action="store_true", help="include Adam optimizer state")
        m.add_argument("--half", action="store_true", help="fp16 weights")
        m.add_argument("--safetensors", action="store_true",
                       help="roundtrip: save/load through safetensors instead")
        m.add_argument("--regular_torch_save", action="store_true",
                       help="roundtrip: plain torch.save/torch.load instead of fastpersist")
        m.add_argument("--local_rank", type=int, default=0)
    ld = sub.add_parser("load", help="save once, then time torch.load, fastpersist.load (and "
                        "safetensors) on the cold file, evicted from the page cache each loop")
    ld.add_argument("--folder", required=True, help="I/O folder (e.g. an NVMe mount)")
    what = ld.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", choices=sorted(models.MODELS), help="a model's state_dict")
    what.add_argument("--mb_size", type=int, help="one uint8 tensor of this many MiB")
    ld.add_argument("--half", action="store_true", help="fp16 weights (--model)")
    ld.add_argument("--loops", type=int, default=3, help="cold loads per loader (default 3)")
    ld.add_argument("--drop_caches", action="store_true",
                    help="also write 1 to /proc/sys/vm/drop_caches before each load (root)")
    ld.add_argument("--no-safetensors", dest="safetensors", action="store_false",
                    help="skip the safetensors comparison")
    peers_cli.add_parser(sub)
    deepspeed_save.add_parser(sub)
    return p


def _settings(args: argparse.Namespace) -> savers.SaveSettings:
    if args.gpu and not torch.cuda.is_available():
        sys.exit("error: --gpu needs CUDA, but torch.cuda.is_available() is False "
                 f"(torch {torch.__version__})")
    if not os.path.isdir(args.folder):
        sys.exit(f"error: --folder {args.folder!r} is not a directory")
    return savers.SaveSettings(folder=args.folder, io_buffer_mb=args.io_buffer_mb,
                               single_io_buffer=args.single_io_buffer, zipfile=args.zipfile,
                               show_statistics=args.statistics, gpu=args.gpu)


def _print_command(argv: Optional[List[str]] = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    print("# " + " ".join([os.path.basename(sys.executable), "-m", "fastpersist.bench"] + args))
    print(f"# torch {torch.__version__}; GB = 1e9 bytes", flush=True)


def run_tensor(args: argparse.Namespace) -> int:
    s = _settings(args)
    device = "cuda" if args.gpu else "cpu"
    t = torch.randint(high=128, size=(args.mb_size * (1 << 20),), dtype=torch.uint8, device=device)
    savers.run_all(t, s, f"{args.mb_size}MB", args.only, loops=args.loops, rotate=args.rotate,
                   warmup=args.warmup)
    return 0


def run_model(args: argparse.Namespace) -> int:
    s = _settings(args)
    if args.optimizer and args.half and not args.gpu:
        sys.exit("error: --optimizer with --half needs --gpu (as in DeepSpeedExamples)")
    start = time.perf_counter()
    model = models.build(args.model, half=args.half, gpu=args.gpu)
    state = {"model": model}
    if args.optimizer:
        state["optimizer"] = models.with_optimizer_state(model)
    print(f"# built {args.model} in {time.perf_counter() - start:.1f}s", flush=True)
    savers.run_all(state, s, args.model, args.only, loops=args.loops, rotate=args.rotate,
                   warmup=args.warmup)
    return 0


def run_roundtrip(args: argparse.Namespace) -> int:
    s = _settings(args)
    model = models.build(args.model, half=args.half, gpu=args.gpu, seed=0)
    batch = models.sample_input(model)
    with torch.no_grad():
        before = model(**batch).logits.float()
    path = os.path.join(s.folder, f"roundtrip_{args.model}" + (".safetensors" if args.safetensors else ".pt"))
    sd = model.state_dict()
    start = time.perf_counter()
    if args.safetensors:
        from safetensors.torch import load_file, save_model

        save_model(model, path)
        saved = time.perf_counter()
        restored = load_file(path)
    elif args.regular_torch_save:
        torch.save(sd, path)
        saved = time.perf_counter()
        restored = torch.load(path, weights_only=True)
    else:
        serialization.save(sd, path, io_buffer_mb=s.io_buffer_mb, single_io_buffer=s.single_io_buffer)
        saved = time.perf_counter()
        restored = serialization.load(path, weights_only=True)
    loaded = time.perf_counter()
    fresh = models.build(args.model, half=args.half, gpu=args.gpu, seed=123)  # different weights
    missing, unexpected = fresh.load_state_dict(restored, strict=not args.safetensors)
    with torch.no_grad():
        after = fresh(**batch).logits.float()
    os.unlink(path)
    ok = torch.allclose(before, after, atol=1e-3, rtol=1e-3)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    print(f"roundtrip {args.model}: save {saved - start:.2f}s, load {loaded - saved:.2f}s, "
          f"{nbytes / 1e9:.2f} GB, outputs {'match' if ok else 'DIFFER'}")
    return 0 if ok else 1


def run_load(args: argparse.Namespace) -> int:
    if not os.path.isdir(args.folder):
        sys.exit(f"error: --folder {args.folder!r} is not a directory")
    if args.loops < 1:
        sys.exit("error: --loops must be at least 1")
    if args.model:
        start = time.perf_counter()
        model = models.build(args.model, half=args.half)
        state = model.state_dict()
        del model
        print(f"# built {args.model} in {time.perf_counter() - start:.1f}s", flush=True)
        stem = args.model
    else:
        state = {"tensor": torch.randint(high=128, size=(args.mb_size << 20,), dtype=torch.uint8)}
        stem = f"{args.mb_size}MB"
    results = loaders.run_load(state, args.folder, stem, args.loops, drop_caches=args.drop_caches,
                               safetensors=args.safetensors)
    loaders.print_summary(results)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if getattr(args, "loops", 1) < 1:
        sys.exit("error: --loops must be at least 1")
    _print_command(argv)
    return {"tensor": run_tensor, "model": run_model, "roundtrip": run_roundtrip,
            "load": run_load, "peers": peers_cli.run, "deepspeed": deepspeed_save.run}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
