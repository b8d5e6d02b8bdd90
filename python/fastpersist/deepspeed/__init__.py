# SPDX-License-Identifier: Apache-2.0
"""fastpersist as DeepSpeed's checkpoint engine.

Two lines after ``deepspeed.initialize``::

    import fastpersist.deepspeed
    fastpersist.deepspeed.install(engine, keep_last=3)   # or async_save=True, ...

and ``engine.save_checkpoint`` / ``engine.load_checkpoint`` keep working, with every tag written
through O_DIRECT, durable, checksummed in a manifest and committed atomically for all ranks. The
files keep DeepSpeed's names and bytes (``torch.save`` output), so DeepSpeed without fastpersist,
``zero_to_fp32`` and ``ds_to_universal`` read them. See docs/integrations.md.
"""

from .engine import FastPersistCheckpointEngine
from .install import install, installed, wait
from .loading import load_checkpoint

__all__ = ["FastPersistCheckpointEngine", "install", "installed", "load_checkpoint", "wait"]
