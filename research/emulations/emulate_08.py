"""CPU emulation of stage 08's data layouts (no GPU): TMA's 128-byte swizzle, the wgmma matrix
descriptors read as CUTLASS's canonical GMMA layouts, the accumulator fragment layout, the
swizzled P store. Runs the kernel's per-thread algorithm for one CTA and compares with a float64
reference. It checks that the kernel's addresses, LBO/SBO values and fragment indexing agree with
each other under the documented hardware rules; it cannot check the hardware itself.

    python3 emulate.py
"""
import numpy as np

HEAD_DIM, BLOCK_M, BLOCK_N, BOX_COLS, KV_STAGES = 128, 64, 64, 64, 2
Q_TILE_BYTES = BLOCK_M * HEAD_DIM * 2
KV_TILE_BYTES = BLOCK_N * HEAD_DIM * 2
P_TILE_BYTES = BLOCK_M * BLOCK_N * 2
SMEM_BASE = 1024 * 3  # any multiple of 1024 (the kernel traps otherwise)


def swz(addr):
    """128-byte swizzle on a shared-memory byte address: bits 4-6 ^= bits 7-9."""
    return addr ^ (((addr >> 7) & 7) << 4)


def bf16(x):
    """Round float32 to bf16 (round to nearest even), returned as float32."""
    a = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    a = ((a + 0x7FFF + ((a >> 16) & 1)) >> 16) << 16
    return a.astype(np.uint32).view(np.float32)


class Smem:
    def __init__(self, size):
        self.mem = {}  # byte address (even) -> float value of a bf16

    def tma_box(self, dst, box):  # box: [rows][64] values; TMA with SWIZZLE_128B
        assert dst % 1024 == 0 and box.shape[1] == BOX_COLS
        for r in range(box.shape[0]):
            for c in range(BOX_COLS):
                self.mem[swz(dst + r * 128 + c * 2)] = box[r, c]

    def st_b32(self, addr, lo, hi):  # plain store: no swizzle applied by hardware
        assert addr % 4 == 0
        self.mem[addr] = lo
        self.mem[addr + 2] = hi

    def read(self, addr):
        return self.mem[addr]


def decode(desc):
    start = (desc & 0x3FFF) << 4
    lbo = ((desc >> 16) & 0x3FFF) << 4
    sbo = ((desc >> 32) & 0x3FFF) << 4
    base_off = (desc >> 49) & 7
    layout = desc >> 62
    assert layout == 1 and base_off == 0
    return start, lbo, sbo


def make_desc(addr, lbo, sbo):  # transcription of make_smem_desc_sw128
    return ((addr >> 4) & 0x3FFF) | (((lbo >> 4) & 0x3FFF) << 16) | (((sbo >> 4) & 0x3FFF) << 32) | (1 << 62)


def operand(smem, desc, mn, k_major):
    """The [mn][16] operand a descriptor names, read as CUTLASS's canonical SW128 layouts (bytes):
    K-major  ((8,m),(8,2)) : ((128, SBO), (2, 16))              [LBO unused]
    MN-major ((64,n),(8,k)) : ((2, LBO), (128, SBO))  (k = 2)"""
    start, lbo, sbo = decode(desc)
    out = np.zeros((mn, 16), dtype=np.float32)
    for i in range(mn):
        for kk in range(16):
            if k_major:
                off = (i % 8) * 128 + (i // 8) * sbo + kk * 2
            else:
                off = (i % 64) * 2 + (i // 64) * lbo + (kk % 8) * 128 + (kk // 8) * sbo
            out[i, kk] = smem.read(swz(start + off))
    return out


def frag_coord(t, v):
    """CUTLASS CLayout_64xN: thread t = t0 + 4 t1 + 32 t2, value v = v0 + 2 v1 + 4 v2."""
    t0, t1, t2 = t % 4, (t // 4) % 8, t // 32
    v0, v1, v2 = v % 2, (v // 2) % 2, v // 4
    return t1 + 8 * v1 + 16 * t2, 2 * t0 + v0 + 8 * v2


def wgmma(acc, a, b, accumulate):
    """acc[thread][v] (+)= (a @ b.T) distributed in the accumulator layout; a [64][16], b [N][16]."""
    d = a.astype(np.float64) @ b.astype(np.float64).T
    for t in range(128):
        for v in range(acc.shape[1]):
            m, n = frag_coord(t, v)
            acc[t, v] = d[m, n] + (acc[t, v] if accumulate else 0.0)


def run(len_k, scale, seed):
    rng = np.random.default_rng(seed)
    q = bf16(rng.standard_normal((BLOCK_M, HEAD_DIM)) * 4)
    k = bf16(rng.standard_normal((len_k, HEAD_DIM)) * 4)
    v = bf16(rng.standard_normal((len_k, HEAD_DIM)))
    smem = Smem(0)
    q_tile = SMEM_BASE
    k_tiles = q_tile + Q_TILE_BYTES
    v_tiles = k_tiles + KV_STAGES * KV_TILE_BYTES
    p_tile = v_tiles + KV_STAGES * KV_TILE_BYTES

    def load_tile(tile, src, rows):  # load_tile<ROWS>: one box per 64 columns
        for box in range(HEAD_DIM // BOX_COLS):
            smem.tma_box(tile + box * rows * BOX_COLS * 2, src[:, box * BOX_COLS:(box + 1) * BOX_COLS])

    load_tile(q_tile, q, BLOCK_M)
    o_acc = np.zeros((128, HEAD_DIM // 2))
    row_max = np.full((128, 2), -np.inf)
    row_sum = np.zeros((128, 2))
    scale_log2 = np.float32(scale * 1.4426950408889634)
    rescales = 0
    for tile in range(len_k // BLOCK_N):
        st = tile % KV_STAGES
        k_tile = k_tiles + st * KV_TILE_BYTES
        v_tile = v_tiles + st * KV_TILE_BYTES
        load_tile(k_tile, k[tile * BLOCK_N:(tile + 1) * BLOCK_N], BLOCK_N)
        load_tile(v_tile, v[tile * BLOCK_N:(tile + 1) * BLOCK_N], BLOCK_N)
        s = np.zeros((128, BLOCK_N // 2))
        for kk in range(HEAD_DIM // 16):
            offset = (kk * 16 // BOX_COLS) * (BLOCK_N * BOX_COLS * 2) + (kk * 16 % BOX_COLS) * 2
            desc_q = make_desc(q_tile + (kk * 16 // BOX_COLS) * (BLOCK_M * BOX_COLS * 2) + (kk * 16 % BOX_COLS) * 2, 16, 1024)
            desc_k = make_desc(k_tile + offset, 16, 1024)
            a = operand(smem, desc_q, 64, True)
            b = operand(smem, desc_k, BLOCK_N, True)
            assert np.array_equal(a, q[:, kk * 16:kk * 16 + 16])  # the descriptor names the right data
            assert np.array_equal(b, k[tile * BLOCK_N:(tile + 1) * BLOCK_N, kk * 16:kk * 16 + 16])
            wgmma(s, a, b, kk > 0)
        # per-thread softmax, as the kernel writes it
        s = s.astype(np.float32)
        for w in range(4):
            tile_max = np.zeros((32, 2), dtype=np.float32)
            grew = False
            for lane in range(32):
                t = 32 * w + lane
                for half in range(2):
                    x = max(max(s[t, 4 * j + 2 * half], s[t, 4 * j + 2 * half + 1]) for j in range(BLOCK_N // 8))
                    tile_max[lane, half] = x
            for lane in range(32):  # quad_max
                base = lane - lane % 4
                for half in range(2):
                    tm = tile_max[base:base + 4, half].max()
                    t = 32 * w + lane
                    grew |= bool((tm - row_max[t, half]) * scale_log2 > 8.0)
            qmax = np.array([[tile_max[ln - ln % 4:ln - ln % 4 + 4, h].max() for h in range(2)] for ln in range(32)])
            if grew:
                rescales += 1
                for lane in range(32):
                    t = 32 * w + lane
                    for half in range(2):
                        new_max = max(row_max[t, half], qmax[lane, half])
                        corr = np.exp2((row_max[t, half] - new_max) * scale_log2)
                        row_max[t, half] = new_max
                        row_sum[t, half] *= corr
                        for j in range(HEAD_DIM // 8):
                            o_acc[t, 4 * j + 2 * half] *= corr
                            o_acc[t, 4 * j + 2 * half + 1] *= corr
            for lane in range(32):
                t = 32 * w + lane
                group, quad = lane // 4, lane % 4
                for half in range(2):
                    max_scaled = row_max[t, half] * scale_log2
                    row = w * 16 + group + 8 * half
                    for j in range(BLOCK_N // 8):
                        p0 = np.exp2(np.float32(s[t, 4 * j + 2 * half] * scale_log2 - max_scaled))
                        p1 = np.exp2(np.float32(s[t, 4 * j + 2 * half + 1] * scale_log2 - max_scaled))
                        row_sum[t, half] += p0 + p1
                        smem.st_b32(p_tile + row * 128 + ((j ^ (row % 8)) * 16) + quad * 4, bf16(p0), bf16(p1))
        for j in range(BLOCK_N // 16):
            desc_p = make_desc(p_tile + j * 32, 16, 1024)
            desc_v = make_desc(v_tile + j * 16 * 128, BLOCK_N * BOX_COLS * 2, 1024)
            a = operand(smem, desc_p, 64, True)
            bT = operand(smem, desc_v, HEAD_DIM, False)  # [n = d][k = kv]
            assert np.array_equal(bT, v[tile * BLOCK_N + j * 16:tile * BLOCK_N + j * 16 + 16].T)
            for half in range(2):  # the fallback variant's two n64 descriptors (LBO unused)
                d_half = make_desc(v_tile + half * BLOCK_N * BOX_COLS * 2 + j * 16 * 128, 16, 1024)
                assert np.array_equal(operand(smem, d_half, 64, False),
                                      v[tile * BLOCK_N + j * 16:tile * BLOCK_N + j * 16 + 16, 64 * half:64 * half + 64].T)
            wgmma(o_acc, a, bT, True)
    # epilogue
    out = np.zeros((BLOCK_M, HEAD_DIM))
    for w in range(4):
        for lane in range(32):
            t = 32 * w + lane
            group, quad = lane // 4, lane % 4
            base = 32 * w + lane - quad
            inv = [1.0 / row_sum[base:base + 4, h].sum() for h in range(2)]
            for j in range(HEAD_DIM // 8):
                for half in range(2):
                    r = w * 16 + group + 8 * half
                    out[r, j * 8 + quad * 2] = o_acc[t, 4 * j + 2 * half] * inv[half]
                    out[r, j * 8 + quad * 2 + 1] = o_acc[t, 4 * j + 2 * half + 1] * inv[half]
    sc = (q.astype(np.float64) @ k.astype(np.float64).T) * scale
    pr = np.exp(sc - sc.max(1, keepdims=True))
    ref = (pr / pr.sum(1, keepdims=True)) @ v.astype(np.float64)
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    return err, rescales, np.abs(sc).max()


if __name__ == "__main__":
    for len_k, seed in ((64, 1), (256, 2)):
        err, rescales, peak = run(len_k, 1 / np.sqrt(128), seed)
        print(f"len_k {len_k}: relative error {err:.2e}, warp rescales {rescales}, peak score {peak:.1f}")
        assert err < 1e-2
    print("ok")
