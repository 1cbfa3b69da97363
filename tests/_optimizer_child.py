"""One process of the warm-restart test: Adam under OneCycleLR, compiled with the backend
given as the first argument (eager when none).

Prints how many times the step recompiled after its first compile, and whether
it matched an eager twin.  Run twice with one TORCHINDUCTOR_CACHE_DIR and
TORCH_COMPILE_JOB_ID: the second run starts from the first one's profile.
"""

import sys

import torch
from torch._dynamo.utils import counters

import stableguards  # noqa: F401 - registers the flag (TORCHDYNAMO_STABLE_GUARDS=1)

torch.manual_seed(0)
params = [torch.nn.Parameter(torch.randn(4)) for _ in range(3)]
twin_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
opt, twin = torch.optim.Adam(params, lr=0.01), torch.optim.Adam(twin_params, lr=0.01)
schedules = [torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=20) for o in (opt, twin)]
backend = sys.argv[1] if len(sys.argv) > 1 else "eager"
step = torch.compile(lambda: opt.step(), backend=backend)  # as a training loop calls it
for _ in range(10):
    for p, q in zip(params, twin_params):
        p.grad = torch.randn(4)
        q.grad = p.grad.clone()
    step()
    twin.step()
    for s in schedules:
        s.step()
equal = all(torch.allclose(p, q, rtol=1e-5, atol=1e-6) for p, q in zip(params, twin_params))
print(f"recompiles={counters['stats']['unique_graphs'] - 1} equal={equal}")
