"""One process of the real-model test (tests/test_real_models.py): a tiny, randomly initialized
transformers model, compiled, and compared with eager: called over a growing sequence,
(``train``) run for two training steps with transformers' gradient checkpointing, or
(``generate``) generating.

    python tests/_real_model_child.py FLAG MODEL ACTIVATION infer|train|generate

Prints one JSON line: whether every output equalled eager, the frames Dynamo traced (resume
functions included), and stableguards' explanation.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

import stableguards
from _traced import TRACED


def build(model: str, activation: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        return GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                          activation_function=activation, bos_token_id=0, eos_token_id=0))
    if model == "t5":
        from transformers import T5Config, T5ForConditionalGeneration

        return T5ForConditionalGeneration(T5Config(num_layers=1, num_decoder_layers=1, d_model=32, d_ff=64, d_kv=16,
                                                   num_heads=2, vocab_size=100, feed_forward_proj=activation,
                                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                                        num_attention_heads=2, num_key_value_heads=2, vocab_size=100,
                                        max_position_embeddings=64, hidden_act=activation,
                                        bos_token_id=0, eos_token_id=0, pad_token_id=0))


def _ids(n: int) -> torch.Tensor:
    return torch.randint(0, 100, (1, n), generator=torch.Generator().manual_seed(n))


def infer(model: str, activation: str) -> bool:
    net = build(model, activation).eval()
    compiled = torch.compile(net)
    ok = True
    with torch.no_grad():
        for n in (8, 12, 16):
            ok &= bool(torch.allclose(compiled(_ids(n)).logits, net(_ids(n)).logits, atol=1e-5))
    return ok


def train(model: str, activation: str) -> bool:
    """Two training steps (forward, backward, gradients clipped, a fresh AdamW's ``step()``)
    with every layer checkpointed (non-reentrant), against the same steps run eagerly on a
    copy."""
    def make():
        net = build(model, activation).train()
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)

        def step(ids):
            loss = net(ids, labels=ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()
        return step
    compiled, eager = torch.compile(make()), make()
    return all(bool(torch.allclose(compiled(_ids(8)), eager(_ids(8)), atol=1e-5)) for _ in range(2))


def generate(model: str, activation: str) -> bool:
    """``generate``, 4 new tokens greedily, the forward compiled (T5's decoder cache deep-copies
    the config on every step)."""
    net = build(model, activation).eval()
    forward = net.forward
    outputs = []
    for fn in (torch.compile(forward), forward):
        net.forward = fn
        with torch.no_grad():
            outputs.append(net.generate(_ids(8), max_new_tokens=4, do_sample=False, min_new_tokens=4))
    return bool(torch.equal(*outputs))


def main(flag: str, model: str, activation: str, mode: str) -> dict:
    torch._dynamo.config.stable_guards = flag == "1"
    ok = {"train": train, "generate": generate}.get(mode, infer)(model, activation)
    return {"ok": ok, "frames": len(TRACED), "explain": stableguards.explain()}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])))
