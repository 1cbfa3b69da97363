"""What stableguards adds to `import torch`, measured in fresh processes.

    python bench/import_time.py

torch loads the `torch.backends` entry points at the end of `import torch`;
TORCH_DEVICE_BACKEND_AUTOLOAD=0 switches that off, so the difference between
the two settings is what the installed package costs.  Runs alternate between
the settings; medians are reported.  `-X importtime` gives the package's own
share without the noise of the whole import.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time

RUNS = 11


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


def main() -> None:
    off, on = [], []
    for _ in range(RUNS):
        off.append(import_seconds(False))
        on.append(import_seconds(True))
    off_s, on_s = statistics.median(off), statistics.median(on)
    print(f"{'import torch':<34} {'median s':>9}")
    print(f"{'entry points off (no stableguards)':<34} {off_s:>9.3f}")
    print(f"{'entry points on (stableguards)':<34} {on_s:>9.3f}")
    print(f"{'difference':<34} {on_s - off_s:>+9.3f}  ratio {on_s / off_s:.3f}")
    print(f"stableguards' own modules (-X importtime): {own_import_us() / 1000:.1f} ms")


if __name__ == "__main__":
    main()
