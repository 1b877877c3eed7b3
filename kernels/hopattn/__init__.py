"""hopattn: attention on NVIDIA Hopper, built stage by stage.

``from hopattn import attention`` gives the kernel API (needs torch); ``hopattn.lineage`` (the
stages and their specs) and ``hopattn.records`` (the results and compiler-facts files) need only the
standard library, so the documentation site builds without torch.

The custom ops ``torch.ops.hopattn.attention`` and ``attention_out`` are registered by
``hopattn.api``: on ``import hopattn`` when torch is already imported, else on first use of
``hopattn.attention`` (or ``import hopattn.api``).
"""

import sys

__all__ = ["attention", "attention_backward", "stage_info", "stages", "final_stage", "rms_norm", "softmax",
           "cross_entropy"]

if "torch" in sys.modules:  # the caller uses torch: register the ops now, so torch.ops.hopattn.* exist
    from . import api  # noqa: F401


def __getattr__(name):
    # The API imports torch; load it only when asked for, so the lineage and results modules stay light.
    if name == "rms_norm":  # Part II (hopattn.rmsnorm registers torch.ops.hopattn.rms_norm on import)
        from . import rmsnorm

        return rmsnorm.rms_norm
    if name == "softmax":  # Part II (hopattn.softmax_ops registers torch.ops.hopattn.softmax on import)
        from . import softmax_ops

        return softmax_ops.softmax
    if name == "cross_entropy":  # Part II (hopattn.cross_entropy_ops registers torch.ops.hopattn.cross_entropy)
        from . import cross_entropy_ops

        return cross_entropy_ops.cross_entropy
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'hopattn' has no attribute {name!r}")
