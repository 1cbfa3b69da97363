"""Real models across a restart: cold and warm compile seconds, what the warm process traced and
how the caches answered, flag off (with and without a job id) vs on.

Each workload (bench/_real_model_child.py: tiny transformers models with random init, no
downloads, training steps with and without their gradient checkpointing, and one with custom
autograd and selective checkpointing) runs in a cold
process, then a warm one on the same new cache dir.  Columns:

* cold s, warm s, warm/cold: what ``torch.compile()`` and the first calls cost beyond running them;
* warm full GC s: of warm s, what Python's full garbage collections took (each walks the whole
  process's heap, whoever allocated last);
* frames: frames Dynamo traced in the warm process, resume functions included (0: all installed from
  saved entries);
* FX h/m/b, AOT h/m/b: FX-graph and AOTAutograd cache hits, misses and bypasses, warm;
* ok: cold and warm outputs equalled eager.

    python bench/real_models.py                          # every workload
    python bench/real_models.py --workloads gpt2 custom_train
    python bench/real_models.py --new-machine            # warm on another machine, one shared store
    python bench/real_models.py --workloads qwen2 mistral phi3 gemma falcon opt gpt_neox bart t5 \
        bart_generate t5_generate

The last line runs inference (8, 12, 16 tokens) on other families of transformers models, each
built from a tiny config of one shape (``FAMILIES``), and T5's and BART's ``generate``; not run
by default.

With ``--new-machine`` the warm process has an empty cache dir of its own and both name one
shared store (``STABLEGUARDS_STORE``, a directory): flag off (torch alone: nothing is shared), on
with warm start left to torch (torch's caches served by the store), and on.

Writes bench/out/real_models.json (real_models_new_machine.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import report
from columns import aligned

HERE = Path(__file__).resolve().parent
WORKLOADS = ("gpt2", "llama", "llama_generate", "bert_kwargs", "gpt2_train", "llama_checkpointed_train",
             "gpt2_compiled_autograd", "custom_train")
# Other transformers families (bench/_real_model_child.py's), named with --workloads.
FAMILIES = ("qwen2", "mistral", "phi3", "gemma", "falcon", "opt", "gpt_neox", "bart", "t5", "bart_generate",
            "t5_generate")
# config: (flag, job id, extra environment)
CONFIGS = {"off": ("0", None, {}), "off+job": ("0", "bench", {}), "on": ("1", None, {})}
NEW_MACHINE_CONFIGS = {"off": ("0", None, {}), "on, no warm start": ("1", None, {"STABLEGUARDS_DISABLE": "warm_start"}),
                       "on": ("1", None, {})}


def run_child(workload: str, cache_dir: str, config: tuple, store: str | None = None) -> dict:
    flag, job_id, extra = config
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_COMPILE_JOB_ID", "STABLEGUARDS_DISABLE") and not k.startswith("STABLEGUARDS_STORE")}
    env.update(TORCHINDUCTOR_CACHE_DIR=cache_dir, TORCHDYNAMO_STABLE_GUARDS=flag, PYTHONHASHSEED="random", **extra)
    if job_id:
        env["TORCH_COMPILE_JOB_ID"] = job_id
    if store:
        env["STABLEGUARDS_STORE"] = store
    proc = subprocess.run([sys.executable, str(HERE / "_real_model_child.py"), workload], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{workload} child failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(workload: str, config: str, new_machine: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="sg-real-") as root:
        if new_machine:  # two cache dirs, one store
            settings, store = NEW_MACHINE_CONFIGS[config], os.path.join(root, "store")
            cold = run_child(workload, os.path.join(root, "machine-a"), settings, store)
            warm = run_child(workload, os.path.join(root, "machine-b"), settings, store)
        else:
            cold = run_child(workload, root, CONFIGS[config])
            warm = run_child(workload, root, CONFIGS[config])
    return {"workload": workload, "config": config, "cold": cold, "warm": warm}


COLUMNS = (
    ("workload", lambda r: r["workload"]),
    ("flag", lambda r: r["config"]),
    ("cold s", lambda r: f"{r['cold']['compile_s']:.2f}"),
    ("warm s", lambda r: f"{r['warm']['compile_s']:.2f}"),
    ("warm/cold", lambda r: f"{r['warm']['compile_s'] / r['cold']['compile_s']:.3f}"),
    ("warm full GC s", lambda r: f"{r['warm']['full_gc_s']:.2f}"),
    ("frames", lambda r: r["warm"]["frames"]),
    ("FX h/m/b", lambda r: "/".join(map(str, r["warm"]["fx"]))),
    ("AOT h/m/b", lambda r: "/".join(map(str, r["warm"]["aot"]))),
    ("ok", lambda r: "yes" if r["cold"]["ok"] and r["warm"]["ok"] else "NO"),
)


def format_table(rows: list[dict]) -> str:
    return aligned(COLUMNS, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=[*WORKLOADS, *FAMILIES])
    parser.add_argument("--new-machine", action="store_true",
                        help="warm in an empty cache dir of its own; cold and warm share one store")
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    import torch
    import transformers

    where = ("a fresh process with an empty cache dir, sharing the cold one's store" if args.new_machine
             else "a fresh process on the cold one's cache dir")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, inductor on CPU; warm = {where}",
          flush=True)
    rows = []
    for workload in args.workloads:
        for config in NEW_MACHINE_CONFIGS if args.new_machine else CONFIGS:
            rows.append(measure(workload, config, args.new_machine))
            print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(format_table(rows))
    name = "real_models_new_machine" if args.new_machine else "real_models"
    print(f"rows: {report.write(args.out, name, rows, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
