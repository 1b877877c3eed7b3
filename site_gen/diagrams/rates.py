"""H200 rates the schedule model turns FLOP and byte counts into time with (DESIGN.md numbers).

Assumptions, stated once so the timeline caption can repeat them:
- one CTA has its SM to itself (per-SM rates; other resident CTAs would share them);
- tensor cores: 989 TFLOP/s datasheet / 132 SMs for wgmma; mma.sync reaches about 2/3 of that;
- MUFU: 16 exp2 per clock per SM, FP32 FMA: 128 per clock per SM, at 1.98 GHz;
- K/V tiles are re-read by every query tile of the same head, so they are L2 hits: L2 is taken
  as twice the measured device-copy rate (4.24 TB/s), shared by 132 SMs; O goes to HBM at 4.24 TB/s.
"""

SMS = 132
CLOCK_HZ = 1.98e9
TENSOR_FLOPS_SM = 989e12 / SMS  # wgmma, dense bf16
# The datasheet's 989 TFLOP/s is Hopper's 4096 dense bf16 FLOP per clock per SM at 1.83 GHz, not at
# the 1.98 GHz the other per-clock rates are taken at: the clock a measured step's cycles are read at
# when the model says the tensor cores bind.
TENSOR_FLOPS_PER_CLK = 4096
TENSOR_CLOCK_HZ = TENSOR_FLOPS_SM / TENSOR_FLOPS_PER_CLK
MMA_SYNC_FRACTION = 2 / 3  # mma.sync on Hopper
MUFU_PER_CLK = 16
FMA_PER_CLK = 128
HBM_BYTES_S = 4.24e12
L2_FACTOR = 2.0
L2_BYTES_SM = HBM_BYTES_S * L2_FACTOR / SMS
HBM_BYTES_SM = HBM_BYTES_S / SMS

ASSUMPTIONS = (
    "per SM, one CTA resident: wgmma 7.49 TFLOP/s (989/132), mma.sync 2/3 of that; "
    "MUFU 16 exp2/clk and FMA 128/clk at 1.98 GHz; K/V loads hit L2 at 2 × 4.24 TB/s / 132 SMs; "
    "O stores go to HBM at 4.24 TB/s / 132 SMs"
)
