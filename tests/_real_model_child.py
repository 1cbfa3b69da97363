"""One process of the real-model test (tests/test_real_models.py): a tiny, randomly initialized
transformers model, compiled, called over a growing sequence and compared with eager.

    python tests/_real_model_child.py FLAG MODEL ACTIVATION

Prints one JSON line: whether every output equalled eager, the frames Dynamo traced, and
stableguards' explanation.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from torch._dynamo.utils import counters

import stableguards


def build(model: str, activation: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                          activation_function=activation, bos_token_id=0, eos_token_id=0))
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                        num_attention_heads=2, num_key_value_heads=2, vocab_size=100,
                                        max_position_embeddings=64, hidden_act=activation,
                                        bos_token_id=0, eos_token_id=0, pad_token_id=0))


def main(flag: str, model: str, activation: str) -> dict:
    torch._dynamo.config.stable_guards = flag == "1"
    net = build(model, activation).eval()
    compiled = torch.compile(net)
    ok = True
    with torch.no_grad():
        for n in (8, 12, 16):
            ids = torch.randint(0, 100, (1, n), generator=torch.Generator().manual_seed(n))
            ok &= bool(torch.allclose(compiled(ids).logits, net(ids).logits, atol=1e-5))
    return {"ok": ok, "frames": counters["frames"]["ok"], "explain": stableguards.explain()}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])))
