"""One process of the real-model bench: compile a tiny transformers model (random init, no
downloads) or a training step with custom autograd, run it, print counters and timings as JSON.

    python bench/_real_model_child.py WORKLOAD

The environment (cache dir, flag, job id) is set by bench/real_models.py.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch._dynamo.utils as dynamo_utils

import models
import stableguards
from _traced import TRACED

# Seconds spent in torch.compile() itself: with the flag it is where a saved entry is read and
# installed, so it counts towards compile seconds.
IN_COMPILE = [0.0]
_torch_compile = torch.compile


class _FullCollections:
    """Seconds of full garbage collections (generation 2) within the timed code.  One walks
    every object of the process (torch's, transformers', the model's: about 0.2 s here),
    whoever allocated last; counted in compile seconds, and shown apart.

    The timed code starts from a collected heap (``timing`` collects first, untimed), as
    ``timeit``'s does (it turns collection off): otherwise a collection that building the
    model left due falls into it at random."""

    def __init__(self) -> None:
        self.seconds, self._timing, self._start = 0.0, False, None
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if info["generation"] != 2 or not self._timing:
            return
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None

    @contextlib.contextmanager
    def timing(self):
        if self._timing:  # a compile the timed code makes (transformers may call torch.compile)
            yield
            return
        gc.collect()
        self._timing = True
        try:
            yield
        finally:
            self._timing = False


FULL_GC = _FullCollections()


def _timed_compile(*args, **kwargs):
    with FULL_GC.timing():
        start = time.perf_counter()
        try:
            return _torch_compile(*args, **kwargs)
        finally:
            IN_COMPILE[0] += time.perf_counter() - start


torch.compile = _timed_compile

_gpt2, _llama = models.gpt2, models.llama


# Other families, by transformers model type: tiny configs of one shape.
_FAMILY = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
               pad_token_id=0, decoder_start_token_id=0)
_FAMILY_EXTRA = {"gemma": dict(head_dim=16), "opt": dict(ffn_dim=128, word_embed_proj_dim=64),
                 "t5": dict(d_ff=128, d_kv=16, num_decoder_layers=2),
                 "bart": dict(encoder_layers=2, decoder_layers=2, d_model=64, encoder_ffn_dim=128,
                              decoder_ffn_dim=128, encoder_attention_heads=4, decoder_attention_heads=4)}
FAMILIES = ("qwen2", "mistral", "phi3", "gemma", "falcon", "opt", "gpt_neox", "bart", "t5")
_SEQ2SEQ = ("bart", "t5")


def _family(model_type: str):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    config = AutoConfig.for_model(model_type, **_FAMILY, **_FAMILY_EXTRA.get(model_type, {}))
    auto = AutoModelForSeq2SeqLM if model_type in _SEQ2SEQ else AutoModelForCausalLM
    return lambda: auto.from_config(config)


_ids = models.ids


def infer(build, seq2seq: bool = False):
    """Inference over a growing sequence (8, 12, 16 tokens): logits.  An encoder-decoder model
    (``seq2seq``) is given the same tokens as its decoder's input."""
    def workload():
        model = build().eval()
        compiled = torch.compile(model)

        def run(m):
            with torch.no_grad():
                return [m(_ids(n), **({"decoder_input_ids": _ids(n)} if seq2seq else {})).logits
                        for n in (8, 12, 16)]
        return lambda: run(compiled), lambda: run(model)
    return workload


def generate(build):
    """``generate`` with its KV cache, 4 new tokens greedily, the forward compiled: Llama's, and
    T5's and BART's, whose decoder cache deep-copies the config on every step."""
    def workload():
        model = build().eval()
        forward = model.forward
        compiled = torch.compile(forward)

        def run(fn):
            model.forward = fn
            with torch.no_grad():
                return [model.generate(_ids(8), max_new_tokens=4, do_sample=False, min_new_tokens=4).float()]
        return lambda: run(compiled), lambda: run(forward)
    return workload


def bert_kwargs():
    """BERT called with ``**batch`` (input ids, attention mask, token types)."""
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                 num_attention_heads=4, vocab_size=128, max_position_embeddings=64)).eval()
    compiled = torch.compile(model)

    def run(m):
        out = []
        with torch.no_grad():
            for n in (8, 12, 16):
                batch = {"input_ids": _ids(n), "attention_mask": torch.ones(1, n, dtype=torch.long),
                         "token_type_ids": torch.zeros(1, n, dtype=torch.long)}
                out.append(m(**batch).last_hidden_state)
        return out
    return lambda: run(compiled), lambda: run(model)


def train(build, checkpointed: bool = False, optimizer: str = "SGD"):
    """A training step: forward, backward, ``optimizer.step()`` (a fresh ``torch.optim.<optimizer>``),
    ``loss.detach()`` returned; with ``checkpointed``, transformers' gradient checkpointing
    (non-reentrant) on every layer."""
    def workload():
        def make():
            torch.manual_seed(0)
            model = build().train()
            for name in ("attn_pdrop", "resid_pdrop", "embd_pdrop", "attention_dropout"):
                if hasattr(model.config, name):
                    setattr(model.config, name, 0.0)
            if checkpointed:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return models.train_step(model, getattr(torch.optim, optimizer))
        compiled = torch.compile(make())
        eager = make()
        return lambda: [compiled(_ids(n)) for n in (8, 8, 8)], lambda: [eager(_ids(n)) for n in (8, 8, 8)]
    return workload


def gpt2_compiled_autograd():
    """A GPT-2 forward and backward under compiled autograd: ``loss.detach()`` and a gradient."""
    torch._dynamo.config.compiled_autograd = True

    def make():
        torch.manual_seed(0)
        model = _gpt2().train()
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0

        def step(ids):
            loss = model(ids, labels=ids).loss
            loss.backward()
            grad = model.lm_head.weight.grad.clone()
            model.zero_grad(set_to_none=True)
            return [loss.detach(), grad]
        return step
    compiled = torch.compile(make())
    eager = make()
    return (lambda: [t for n in (8, 8) for t in compiled(_ids(n))],
            lambda: [t for n in (8, 8) for t in eager(_ids(n))])


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2 + 0 * x


def _policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op == torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE


def _context_fn():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_policy)


def custom_train():
    """A training step with a custom autograd.Function and selective activation checkpointing."""
    from torch.utils.checkpoint import checkpoint

    def make():
        torch.manual_seed(0)
        layers = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))

        def step(x):
            h = checkpoint(layers, _Scale.apply(x), use_reentrant=False, context_fn=_context_fn)
            loss = h.pow(2).mean()
            loss.backward()
            grads = [p.grad.clone() for p in layers.parameters()]
            layers.zero_grad(set_to_none=True)
            return [loss.detach(), *grads]
        return step
    compiled, eager = torch.compile(make()), make()
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    return lambda: [t for _ in range(2) for t in compiled(x)], lambda: [t for _ in range(2) for t in eager(x)]


WORKLOADS = {"gpt2": infer(_gpt2), "llama": infer(_llama), "llama_generate": generate(_llama),
             "bert_kwargs": bert_kwargs,
             "gpt2_train": train(_gpt2),
             "llama_checkpointed_train": train(_llama, checkpointed=True, optimizer="AdamW"),
             "gpt2_compiled_autograd": gpt2_compiled_autograd, "custom_train": custom_train,
             **{family: infer(_family(family), seq2seq=family in _SEQ2SEQ) for family in FAMILIES},
             **{f"{family}_generate": generate(_family(family)) for family in _SEQ2SEQ}}


def main(name: str) -> dict:
    import torch._inductor.compile_fx  # noqa: F401 - importing inductor is left out of the timings

    compiled, eager = WORKLOADS[name]()
    with FULL_GC.timing():
        start = time.perf_counter()
        outputs = compiled()
        first_s = time.perf_counter() - start
    gc.collect()  # nor a collection the first call left due in the steady one, which is subtracted
    start = time.perf_counter()
    compiled()
    steady_s = time.perf_counter() - start
    frames = len(TRACED)
    traced = [f"{c.co_name} ({os.path.basename(c.co_filename)}:{c.co_firstlineno})" for c in TRACED]
    expected = eager()
    ok = all(torch.allclose(a, b, rtol=1e-3, atol=1e-4) for a, b in zip(outputs, expected, strict=True))
    inductor, aot = dynamo_utils.counters["inductor"], dynamo_utils.counters["aot_autograd"]
    return {
        "compile_s": IN_COMPILE[0] + first_s - steady_s, "full_gc_s": FULL_GC.seconds, "frames": frames,
        "traced": traced, "ok": ok,
        "fx": [inductor["fxgraph_cache_hit"], inductor["fxgraph_cache_miss"], inductor["fxgraph_cache_bypass"]],
        "aot": [aot["autograd_cache_hit"], aot["autograd_cache_miss"], aot["autograd_cache_bypass"]],
        "explain": stableguards.explain(),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
