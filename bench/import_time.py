"""What stableguards adds to `import torch`, measured in fresh processes.

    python bench/import_time.py
    python bench/import_time.py --runs 3      # quicker, noisier

torch loads the `torch.backends` entry points at the end of `import torch`;
TORCH_DEVICE_BACKEND_AUTOLOAD=0 switches that off, so the difference between
the two settings is what the installed package costs.  Runs alternate between
the settings; medians are reported.  `-X importtime` gives the package's own
share without the noise of the whole import.

Writes bench/out/import_time.json.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import report
from columns import aligned

HERE = Path(__file__).resolve().parent

COLUMNS = (
    ("entry points off s", lambda r: f"{r['off_s']:.3f}"),
    ("entry points on s", lambda r: f"{r['on_s']:.3f}"),
    ("difference s", lambda r: f"{r['on_s'] - r['off_s']:+.3f}"),
    ("on/off", lambda r: f"{r['on_s'] / r['off_s']:.3f}"),
    ("own modules ms", lambda r: f"{r['own_us'] / 1000:.1f}"),
)


def import_seconds(autoload: bool) -> float:
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1" if autoload else "0")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], env=env, check=True)
    return time.perf_counter() - start


def own_import_us() -> int:
    """Import time of stableguards' modules and what they pull in, per `-X importtime`.

    The outermost stableguards module's cumulative time covers the others.
    """
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import torch"],
                          capture_output=True, text=True, check=True)
    cumulative = [0]
    for line in proc.stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \|\s+(\S+)$", line.rstrip())
        if match and match.group(2).startswith("stableguards"):
            cumulative.append(int(match.group(1)))
    return max(cumulative)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11, help="imports per setting")
    parser.add_argument("--out", type=Path, default=HERE / "out")
    args = parser.parse_args(argv)
    off, on = [], []
    for _ in range(args.runs):
        off.append(import_seconds(False))
        on.append(import_seconds(True))
    rows = [{"off_s": statistics.median(off), "on_s": statistics.median(on), "own_us": own_import_us()}]
    print("import torch, median of the runs; stableguards' own modules per -X importtime")
    print(aligned(COLUMNS, rows))
    print(f"rows: {report.write(args.out, 'import_time', rows, argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
