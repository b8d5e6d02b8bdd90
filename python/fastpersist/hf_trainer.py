# SPDX-License-Identifier: Apache-2.0
"""``FastPersistTrainer``: a drop-in ``transformers.Trainer`` whose ``checkpoint-N/`` folders
are durable, checksummed and appear only when complete.

The stock Trainer writes a checkpoint's files straight into ``checkpoint-N/`` without fsync, and
``resume_from_checkpoint=True`` takes the newest such folder even when a crash cut its save short
(transformers#35782). Here one save:

1. writes every file into a hidden staging folder ``.checkpoint-N.fp-staging`` next to it: the
   weights and configuration through the model's own ``save_pretrained`` (safetensors that
   ``from_pretrained`` loads), the optimizer and scheduler states through ``fastpersist.save``
   (O_DIRECT, durable), the scaler, RNG and ``trainer_state.json`` as the Trainer writes them;
2. seals it (``_core.seal_folder``): every file fdatasync'ed, a marker of their sizes and XXH3-64
   checksums written last;
3. renames it to ``checkpoint-N`` and fsyncs the output folder; only then may
   ``save_total_limit`` rotate older checkpoints away.

``resume_from_checkpoint=True`` takes the newest sealed checkpoint that still checks (sizes, and
checksums with ``verify_resume=True``), and falls back to the Trainer's own choice when no folder
is sealed (a run the stock Trainer wrote). The files are the stock Trainer's, so it and any tool
read these folders too.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any, List, Optional, Tuple, Union

import transformers  # type: ignore[import-not-found, import-untyped, unused-ignore]
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME  # type: ignore[import-not-found, import-untyped, unused-ignore]
from transformers.trainer_callback import ExportableState  # type: ignore[import-not-found, import-untyped, unused-ignore]
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy, rotate_checkpoints  # type: ignore[import-not-found, import-untyped, unused-ignore]

from . import _core
from ._engine_options import check_flag
from .errors import CheckpointCorruptError
from ._captured_file import CapturedFile, capture_into
from .writer import writer_options

STAGING_SUFFIX = ".fp-staging"
_CHECKPOINT = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


class FastPersistTrainer(transformers.Trainer):  # type: ignore[misc, unused-ignore]
    """``transformers.Trainer`` with durable, checksummed, atomically appearing checkpoints.

    Args:
        verify_resume: ``resume_from_checkpoint=True`` checks each candidate's checksums (reads
            every byte once) rather than only its files' sizes [False].
        durable: fdatasync every file and fsync the folders [None: the C++ default, on].
        *args, **kwargs: ``transformers.Trainer``'s own.
    """

    def __init__(self, *args: Any, verify_resume: bool = False, durable: Optional[bool] = None,
                 **kwargs: Any) -> None:
        self._fp_verify_resume = check_flag("verify_resume", verify_resume)
        self._fp_engine, self._fp_writer = writer_options(durable=durable)  # C++'s default: on
        self._fp_durable = bool(self._fp_writer.durable)
        self._fp_written: List[Tuple[str, int, int]] = []
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------ saving
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.hp_search_backend is None and trial is None:
            self.store_flos()
        run_dir = self._get_output_dir(trial=trial)
        final = os.path.join(run_dir, folder)
        staging = os.path.join(run_dir, f".{folder}{STAGING_SUFFIX}")
        self._fp_written = []  # (name, size, checksum) of the files fastpersist wrote and hashed
        if self.args.should_save:
            shutil.rmtree(staging, ignore_errors=True)  # a save of this step cut short before
            os.makedirs(staging)
        self.accelerator.wait_for_everyone()
        self.save_model(staging, _internal_call=True)
        if not self.args.save_only_model:
            self._save_optimizer_and_scheduler(staging)
            self._save_scaler(staging)
            self._save_rng_state(staging)
        if self.args.should_save:
            exported: Any = self.state.stateful_callbacks  # name -> state (or list of states)
            for cb in [c for c in self.callback_handler.callbacks + [self.control]
                       if isinstance(c, ExportableState)]:
                name, cb_state = cb.__class__.__name__, cb.state()
                if isinstance(exported[name], list):
                    exported[name].append(cb_state)
                else:
                    exported[name] = cb_state
            self.state.save_to_json(os.path.join(staging, TRAINER_STATE_NAME))
        self.accelerator.wait_for_everyone()  # every rank's files (rng_state_<rank>.pth) are in
        if self.args.should_save:
            _commit(staging, final, self._fp_durable, self._fp_written)
        self.accelerator.wait_for_everyone()
        self._note_best_checkpoint(run_dir)
        if self.args.push_to_hub:
            self._push_from_checkpoint(final)
        if self.args.should_save:  # only now: the new checkpoint is committed
            rotate_checkpoints(output_dir=run_dir, save_total_limit=self.args.save_total_limit,
                               best_model_checkpoint=self.state.best_model_checkpoint,
                               use_mtime=True)

    def _note_best_checkpoint(self, run_dir: str) -> None:
        """The Trainer's record of the best checkpoint's folder (load_best_model_at_end)."""
        if self.args.save_strategy in (SaveStrategy.STEPS, SaveStrategy.EPOCH, SaveStrategy.BEST) \
                and self.state.best_global_step:
            best = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.best_global_step}")
            if os.path.exists(best):
                self.state.best_model_checkpoint = best

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        plain = not (self.is_deepspeed_enabled or self.is_fsdp_enabled
                     or transformers.utils.is_torch_xla_available()
                     or transformers.utils.is_sagemaker_mp_enabled())
        if not plain:
            super()._save_optimizer_and_scheduler(output_dir)
            return
        if self.args.should_save:
            engine, writer = self._fp_engine, self._fp_writer
            for obj, name in ((self.optimizer, OPTIMIZER_NAME), (self.lr_scheduler, SCHEDULER_NAME)):
                if obj is None:
                    continue
                # Pickled here, written with O_DIRECT and hashed on the way: the seal takes the
                # record instead of reading the file again.
                f = CapturedFile(output_dir, name, engine, writer, checksums=True)
                record = capture_into(f, obj.state_dict()).persist()
                self._fp_written.append((record.name, int(record.size), int(record.checksum)))

    # ------------------------------------------------------------------ resuming
    def train(self, resume_from_checkpoint: Optional[Union[str, bool]] = None, *args: Any,
              **kwargs: Any) -> Any:
        if resume_from_checkpoint is True and self.args.output_dir is not None:
            found = last_sealed_checkpoint(self.args.output_dir, self._fp_verify_resume)
            if found is not None:
                resume_from_checkpoint = found
        return super().train(resume_from_checkpoint, *args, **kwargs)


def _commit(staging: str, final: str, durable: bool, written: List[Tuple[str, int, int]]) -> None:
    _core.seal_folder(staging, durable, written)
    if os.path.lexists(final):  # the same step saved again: the old folder goes after
        old = f"{os.path.dirname(final)}/.{os.path.basename(final)}.fp-replaced"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(staging, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(staging, final)
    if durable:
        fd = os.open(os.path.dirname(final), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def last_sealed_checkpoint(output_dir: Union[str, "os.PathLike[str]"],
                           verify: bool = False) -> Optional[str]:
    """The newest ``checkpoint-N`` folder of `output_dir` that FastPersistTrainer sealed and that
    still checks (sizes; every byte with `verify`); None when no folder is sealed. A sealed
    folder that changed since is skipped for an older one; CheckpointCorruptError, naming what
    differs, when every sealed folder changed (resume from a path you choose, then)."""
    root = os.fspath(output_dir)
    if not os.path.isdir(root):
        return None
    steps = sorted(((int(m.group(1)), name) for name in os.listdir(root)
                    if (m := _CHECKPOINT.match(name)) and os.path.isdir(os.path.join(root, name))),
                   reverse=True)
    damaged = []
    for _, name in steps:
        state, problem = _core.check_sealed_folder(os.path.join(root, name), verify)
        if state == "sealed":
            return os.path.join(root, name)
        if state == "damaged":
            damaged.append(f"{name}: {problem}")
    if damaged:
        raise CheckpointCorruptError("fastpersist: every sealed checkpoint in " + root +
                                     " changed since it was saved; " + "; ".join(damaged))
    return None


__all__ = ["FastPersistTrainer", "last_sealed_checkpoint", "STAGING_SUFFIX"]
