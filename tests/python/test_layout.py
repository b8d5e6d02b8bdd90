# SPDX-License-Identifier: Apache-2.0
"""`fastpersist._core.layout`: the on-disk names come from C++ (include/fastpersist/layout.h),
and they are the names a saved checkpoint really has."""

from __future__ import annotations

import os

import torch

import fastpersist
from fastpersist import _core

layout = _core.layout


def test_names_are_those_of_the_format():
    assert layout.MANIFEST_FILE_NAME == "manifest.json"
    assert layout.OBJECTS_FILE_NAME == "objects.pkl"
    assert layout.LATEST_FILE_NAME == "latest"
    assert layout.LOCK_FILE_NAME == ".lock"
    assert layout.TEMP_DIR_PREFIX == ".tmp-"
    assert layout.TRASH_DIR_PREFIX == ".trash-"
    assert layout.DATA_FILE_PREFIX == "tensors-"
    assert layout.DATA_FILE_SUFFIX == ".safetensors"


def test_data_file_names_with_and_without_rank():
    assert layout.data_file_name(0, 2) == "tensors-00000-of-00002.safetensors"
    assert layout.data_file_name(1, 2, rank=3) == "tensors-r00003-00001-of-00002.safetensors"
    assert layout.is_data_file_name(layout.data_file_name(4, 9, rank=12))
    assert not layout.is_data_file_name(layout.OBJECTS_FILE_NAME)


def test_a_saved_checkpoint_uses_these_names(tmp_path):
    root = str(tmp_path / "root")
    with fastpersist.CheckpointManager(root, durable=False) as mgr:
        mgr.save("t", {"w": torch.arange(1000, dtype=torch.float32)})
    assert sorted(os.listdir(root)) == sorted([layout.LOCK_FILE_NAME, layout.LATEST_FILE_NAME, "t"])
    names = sorted(os.listdir(os.path.join(root, "t")))
    assert names == [layout.MANIFEST_FILE_NAME, layout.OBJECTS_FILE_NAME,
                     layout.data_file_name(0, 1)]
