"""Frames compiled under DDP's graph split (DDPOptimizer): left out of warm start, and said so.

With ``optimize_ddp`` (torch's default) Dynamo compiles a frame run under
DistributedDataParallel with a frame converter it makes again around
DDPOptimizer's backend (``ConvertFrame._clone_with_backend``), without the
package.  That split compiles each bucket's graph with ``fakify_first_call``,
which AOTAutograd refuses to cache (its first call returns fake outputs), so
no artifact of such a frame exists for an entry to hold.  The frame was traced
again on every restart and no explain() line said why; now one does, naming
the setting that starts it warm.
"""

from __future__ import annotations

from typing import Any

from stableguards.codes import frame_label
from stableguards.hooks.core import Hook
from stableguards.warm_start import messages
from stableguards.warm_start.state import STATE

WHY = ("compiled under DDP's graph split (DDPOptimizer), whose per-bucket graphs AOTAutograd does not cache "
       "(fakify_first_call): a restart traces it again; torch._dynamo.config.optimize_ddp = False compiles it "
       "whole, and it starts warm")


def _clone_with_backend(call: Any, self: Any) -> Any:
    """The converter DDPOptimizer compiles with, for a frame compiled for a package of ours:
    the frame is named as left out of it when it is converted."""
    clone = call(self)
    package = getattr(getattr(self, "_inner_convert", None), "_package", None)
    if package is None or package not in STATE.ours:
        return clone

    def noted(backend: Any) -> Any:
        converter = clone(backend)

        def convert(frame: Any, *args: Any, **kwargs: Any) -> Any:
            messages.left_out(frame_label(frame.f_code), WHY)
            return converter(frame, *args, **kwargs)

        return convert

    return noted


HOOKS = [
    Hook("torch._dynamo.convert_frame", "ConvertFrame._clone_with_backend", "warm_start", _clone_with_backend),
]
