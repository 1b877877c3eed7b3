"""The H200 in numbers (DESIGN.md, "The H200 in numbers"; docs/hopper.md): what the machine
figures draw. The schedule model's rates (rates.py) are the same numbers."""

from . import rates

SMS = rates.SMS  # 132
CLOCK_GHZ = rates.CLOCK_HZ / 1e9  # 1.98
SUBPARTITIONS = 4
REGISTERS = 65536  # 32-bit, per SM
MAX_REGS_PER_THREAD = 255
SMEM_PER_SM_KIB = 228
SMEM_PER_BLOCK_KIB = 227
SMEM_BANKS, SMEM_BANK_BYTES = 32, 4
SMEM_BYTES_PER_CLK = SMEM_BANKS * SMEM_BANK_BYTES  # 128
L1_SMEM_KIB = 256  # combined L1 / shared memory per SM
L2 = "50 MB+"
HBM_GB = 141
HBM_TBS_DATASHEET = 4.8
HBM_TBS_MEASURED = rates.HBM_BYTES_S / 1e12  # 4.24, a device-to-device copy
TENSOR_TFLOPS = 989  # dense bf16, datasheet
CUBLAS_TFLOPS = (679, 701)  # an 8192³ bf16 GEMM on this H200
MUFU_PER_CLK = rates.MUFU_PER_CLK  # 16 exp2 per clock per SM
FMA_PER_CLK = rates.FMA_PER_CLK  # 128 FP32 FMA per clock per SM
MAX_WARPS_PER_SM = 64


def smem_tbs() -> float:
    """Shared-memory bandwidth of the whole chip: 128 B per clock per SM."""
    return SMEM_BYTES_PER_CLK * CLOCK_GHZ * 1e9 * SMS / 1e12


def mufu_per_s() -> float:
    return MUFU_PER_CLK * CLOCK_GHZ * 1e9 * SMS


def fma_per_s() -> float:
    return FMA_PER_CLK * CLOCK_GHZ * 1e9 * SMS
