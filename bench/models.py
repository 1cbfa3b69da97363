"""The transformers models the benches compile: random init from a config, no downloads.

Tiny by default (2 layers, 64 wide); ``layers`` and ``hidden`` scale them up to real sizes
(GPT-2 small is 12 layers, 768 wide)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 128


def gpt2(layers: int = 2, hidden: int = 64):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=hidden, n_head=max(4, hidden // 64), vocab_size=VOCAB,
                                      n_positions=64, bos_token_id=0, eos_token_id=0))


def llama(layers: int = 2, hidden: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(4, hidden // 64)
    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=2 * hidden,
                                        num_attention_heads=heads, num_key_value_heads=heads // 2, vocab_size=VOCAB,
                                        max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
                                        pad_token_id=0))


def ids(n: int):
    """``n`` token ids, the same in every process."""
    import torch

    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(n))


def train_step(model, optimizer: type, lr: float = 0.01):
    """A training step of ``model`` with its dropout off: loss on its own ids, backward, an
    ``optimizer`` step; ``loss.detach()`` returned."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    opt = optimizer(model.parameters(), lr=lr)

    def step(ids):
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step
