# SPDX-License-Identifier: Apache-2.0
"""Hugging Face models of DeepSpeedExamples' ``HF_MODELS_DICT``, built from their configuration
with random weights: no download from any hub. Shapes match the published models."""

from __future__ import annotations

from typing import Any, Callable, Dict

import torch


def _tiny_t5() -> Any:
    from transformers import T5Config, T5ForConditionalGeneration

    # hf-internal-testing/tiny-random-t5
    # decoder_start_token_id goes to PretrainedConfig's **kwargs, which its typed __init__ hides.
    inherited: Dict[str, Any] = {"decoder_start_token_id": 0}
    cfg = T5Config(vocab_size=1103, d_model=32, d_kv=8, d_ff=37, num_layers=5, num_heads=4,
                   relative_attention_num_buckets=8, **inherited)
    return T5ForConditionalGeneration(cfg)


def _gpt2_large() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=1280, n_layer=36, n_head=20, n_positions=1024, vocab_size=50257)
    return GPT2LMHeadModel(cfg)


def _gpt2_medium() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    # Not in DeepSpeedExamples' list: the size that fits twice on a 24 GB machine with its Adam
    # state (multi-rank runs of `python -m fastpersist.bench deepspeed --world 2`).
    cfg = GPT2Config(n_embd=1024, n_layer=24, n_head=16, n_positions=1024, vocab_size=50257)
    return GPT2LMHeadModel(cfg)


def _phi3() -> Any:
    from transformers import Phi3Config, Phi3ForCausalLM

    # microsoft/Phi-3.5-mini-instruct (3.8B parameters)
    cfg = Phi3Config(vocab_size=32064, hidden_size=3072, intermediate_size=8192,
                     num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                     max_position_embeddings=4096)
    return Phi3ForCausalLM(cfg)


def _llama3_1b() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    # meta-llama/Llama-3.2-1B; rope_theta goes to **kwargs, as T5's decoder_start_token_id.
    inherited: Dict[str, Any] = {"rope_theta": 500000.0}
    cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                      num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=4096, tie_word_embeddings=True, **inherited)
    return LlamaForCausalLM(cfg)


MODELS: Dict[str, Callable[[], Any]] = {
    "tiny-t5": _tiny_t5,
    "gpt2-large": _gpt2_large,
    "gpt2-medium": _gpt2_medium,
    "phi3": _phi3,
    "llama3-1B": _llama3_1b,
}


def build(name: str, *, half: bool = False, gpu: bool = False, seed: int = 0) -> Any:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    torch.manual_seed(seed)
    model = MODELS[name]()
    model.eval()
    if half:
        model = model.half()
    if gpu:
        model = model.cuda()
    return model


def sample_input(model: Any, seed: int = 1) -> Dict[str, Any]:
    """A fixed small batch for the model's forward pass (token ids only)."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, 16), generator=g)
    device = next(model.parameters()).device
    batch = {"input_ids": ids.to(device)}
    if model.config.is_encoder_decoder:
        batch["decoder_input_ids"] = ids[:, :8].to(device)
    return batch


def with_optimizer_state(model: Any) -> Any:
    """An Adam optimizer whose state is materialized (one zero-gradient step), so the checkpoint
    holds real optimizer tensors as DeepSpeedExamples' --optimizer does."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return opt
