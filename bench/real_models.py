"""Real models across a restart: cold and warm compile seconds, what the warm process traced and
how the caches answered, flag off (with and without a job id) vs on.

Each workload (bench/_real_model_child.py: tiny transformers models with random init, no
downloads, and a training step with custom autograd and selective checkpointing) runs in a cold
process, then a warm one on the same new cache dir.  Columns:

* cold s, warm s, warm/cold: what ``torch.compile()`` and the first calls cost beyond running them;
* frames: frames Dynamo traced in the warm process, resume functions included (0: all installed from
  saved entries);
* FX h/m/b, AOT h/m/b: FX-graph and AOTAutograd cache hits, misses and bypasses, warm;
* ok: cold and warm outputs equalled eager.

    python bench/real_models.py                          # every workload
    python bench/real_models.py --workloads gpt2 custom_train

Writes bench/out/real_models.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from columns import aligned

HERE = Path(__file__).resolve().parent
WORKLOADS = ("gpt2", "llama", "llama_generate", "bert_kwargs", "gpt2_train", "custom_train")
CONFIGS = {"off": ("0", None), "off+job": ("0", "bench"), "on": ("1", None)}


def run_child(workload: str, cache_dir: str, config: str) -> dict:
    flag, job_id = CONFIGS[config]
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_COMPILE_JOB_ID", "STABLEGUARDS_DISABLE")}
    env.update(TORCHINDUCTOR_CACHE_DIR=cache_dir, TORCHDYNAMO_STABLE_GUARDS=flag, PYTHONHASHSEED="random")
    if job_id:
        env["TORCH_COMPILE_JOB_ID"] = job_id
    proc = subprocess.run([sys.executable, str(HERE / "_real_model_child.py"), workload], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{workload} child failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(workload: str, config: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="sg-real-") as cache_dir:
        cold = run_child(workload, cache_dir, config)
        warm = run_child(workload, cache_dir, config)
    return {"workload": workload, "config": config, "cold": cold, "warm": warm}


COLUMNS = (
    ("workload", lambda r: r["workload"]),
    ("flag", lambda r: r["config"]),
    ("cold s", lambda r: f"{r['cold']['compile_s']:.2f}"),
    ("warm s", lambda r: f"{r['warm']['compile_s']:.2f}"),
    ("warm/cold", lambda r: f"{r['warm']['compile_s'] / r['cold']['compile_s']:.3f}"),
    ("frames", lambda r: r["warm"]["frames"]),
    ("FX h/m/b", lambda r: "/".join(map(str, r["warm"]["fx"]))),
    ("AOT h/m/b", lambda r: "/".join(map(str, r["warm"]["aot"]))),
    ("ok", lambda r: "yes" if r["cold"]["ok"] and r["warm"]["ok"] else "NO"),
)


def format_table(rows: list[dict]) -> str:
    return aligned(COLUMNS, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    import torch
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, inductor on CPU; "
          f"warm = a fresh process on the cold one's cache dir", flush=True)
    rows = []
    for workload in args.workloads:
        for config in CONFIGS:
            rows.append(measure(workload, config))
            print(format_table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(format_table(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "real_models.json").write_text(json.dumps(rows, indent=2))
    print(f"rows: {args.out / 'real_models.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
