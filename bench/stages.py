"""The stages as benchmark arms: building them, and deciding which shapes each can run on this GPU."""

from __future__ import annotations

from bench.arms import Arm, Launch
from bench.shapes import is_user_shape


def _first_lines(text: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return " | ".join(lines[:n])[:400]


def build(stages, jobs=None, log=print) -> dict[int, str]:
    """Compile the stages (cached) and the binding; {stage number: why it failed} for those that did not build."""
    from hopattn import build as hb

    if not stages:
        return {}
    try:
        hb.build_native()
    except Exception as err:  # without the binding no stage can launch
        return {s.number: f"binding build failed: {_first_lines(err)}" for s in stages}
    try:
        hb.build_stages(stages, jobs)
        return {}
    except Exception as err:
        log(f"build: some stages failed ({_first_lines(err, 1)}); isolating them")
    failed = {}
    for s in stages:  # the ones that built are cached now, so this only repeats the failures
        try:
            hb.compile_stage(s)
        except Exception as err:
            failed[s.number] = f"build failed: {_first_lines(err)}"
    return failed


class StageArm(Arm):
    kind = "stage"

    def __init__(self, stage, capability: tuple[int, int], gpu_name: str, build_error: str | None = None):
        self.stage = stage
        self.name = stage.id
        self.label = stage.title
        self.source_hash = stage.source_hash()
        self.capability, self.gpu_name, self.build_error = capability, gpu_name, build_error

    def applies(self, shape, causal):
        s = self.stage
        cc = f"{self.capability[0]}.{self.capability[1]}"
        if s.arch == "sm_90a" and tuple(self.capability) != (9, 0):
            return ("skipped", f"stage uses sm_90a instructions (Hopper, compute capability 9.0); "
                               f"{self.gpu_name} is {cc}")
        if s.arch == "sm_80" and self.capability[0] < 8:
            return ("skipped", f"stage needs compute capability 8.0 or newer; {self.gpu_name} is {cc}")
        if causal and not s.causal:
            return ("skipped", "stage has no causal support (stage.toml supports.causal = false)")
        if s.head_dim_v(shape.head_dim) != shape.dv:
            dims = f"{shape.head_dim}" + (f" (v {shape.dv})" if shape.dv != shape.head_dim else "")
            return ("skipped", f"stage serves head dim {s.head_dims_text()} (stage.toml supports.head_dims), shape "
                               f"has {dims}")
        if not s.tails and (shape.len_q % s.block_m or shape.len_k % s.block_n):
            return ("skipped", f"stage needs lengths that are multiples of its tile ({s.block_m}x{s.block_n})")
        if is_user_shape(shape) and not (s.causal and s.tails and s.strided):
            return ("skipped", "the shapes beyond 4k/8k/16k run on the stages with the whole contract (17 on)")
        if shape.kv_heads and not s.gqa:
            return ("skipped", "stage has no grouped-query attention (stage.toml supports.gqa)")
        if self.build_error:
            return ("failed", self.build_error)
        return None

    def prepare(self, q, k, v, causal, scale):
        import hopattn

        number = self.stage.number
        if self.layout == "bshd":  # the BSHD shape: stored so, read in place (the copy is made here, untimed)
            qs, ks, vs = (t.transpose(1, 2).contiguous() for t in (q, k, v))
            return Launch(fn=lambda: hopattn.attention(qs, ks, vs, causal=causal, scale=scale, stage=number,
                                                       layout="bshd"),
                          to_bhsd=lambda out: out.transpose(1, 2))
        return Launch(fn=lambda: hopattn.attention(q, k, v, causal=causal, scale=scale, stage=number))


def make_stage_arms(stages, capability, gpu_name, build_errors) -> list[Arm]:
    return [StageArm(s, capability, gpu_name, build_errors.get(s.number)) for s in stages]
