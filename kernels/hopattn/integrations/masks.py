"""What an attention mask asks for, in terms the kernel has: nothing, the causal pattern, or more.

Libraries hand attention functions masks even when they mean no masking at all (LTX-2's text mask
is all ones once its connectors replace padding with registers) or plain causal masking (a prefill
chunk after a cache: the bottom-right causal pattern). Those are served; anything else — padding,
packed sequences, sliding windows, additive biases — is not.
"""

from __future__ import annotations

import weakref

import torch

NONE = "none"  # every query sees every key
CAUSAL = "causal"  # query i sees keys j <= i + Lk - Lq (bottom-right aligned)
OTHER = "other"

# Additive masks write "masked" as a large negative number: -inf, finfo.min, or -10000 (diffusers).
MASKED_AT_OR_BELOW = -1.0e4

# Verdicts of the masks seen lately: id(mask) -> (weak ref to it, its version, q_len, k_len, verdict).
# A model passes the same few masks to every layer (LTX-2: one per stream and direction, taken in
# turn), and classifying one reads it back to the host: a device sync that stalls the CPU's run-ahead.
# So each mask is read once while it lives and is not written to, however the model interleaves them.
_CACHE_SIZE = 16
_cache: dict[int, tuple] = {}


def classify(mask: torch.Tensor | None, q_len: int, k_len: int, view: torch.Tensor | None = None) -> str:
    """NONE, CAUSAL or OTHER for a bool (True = attend) or additive float mask broadcastable to
    [B, H, q_len, k_len]. ``view``: the mask as it is to be read (a 4-D view of ``mask`` made by the
    caller, which is a new tensor every call); the verdict is remembered for ``mask`` itself, so a
    mask reshaped per call is still read once (reading ends in a device-to-host sync)."""
    if mask is None:
        return NONE
    c = _cache.get(id(mask))
    if c is not None and c[0]() is mask and c[1:4] == (mask._version, q_len, k_len):
        return c[4]
    verdict = _classify(mask if view is None else view, q_len, k_len)
    for key in [key for key, entry in _cache.items() if entry[0]() is None]:  # masks that are gone
        del _cache[key]
    if len(_cache) >= _CACHE_SIZE:
        del _cache[next(iter(_cache))]  # the oldest
    _cache[id(mask)] = (weakref.ref(mask), mask._version, q_len, k_len, verdict)
    return verdict


def _classify(mask: torch.Tensor, q_len: int, k_len: int) -> str:
    if mask.dim() < 2 or mask.shape[-1] != k_len or mask.shape[-2] not in (1, q_len):
        return OTHER
    if mask.dtype == torch.bool:
        allowed = mask
    elif mask.is_floating_point():
        allowed = mask == 0
        if not bool((allowed | (mask <= MASKED_AT_OR_BELOW)).all()):
            return OTHER  # a bias (ALiBi, relative positions): not a mask the kernel can express
    else:
        return OTHER
    if bool(allowed.all()):
        return NONE
    if allowed.shape[-2] != q_len:
        return OTHER  # key padding
    rows = torch.arange(q_len, device=mask.device)[:, None]
    cols = torch.arange(k_len, device=mask.device)[None, :]
    if bool((allowed == (cols <= rows + (k_len - q_len))).all()):
        return CAUSAL
    return OTHER


def top_left_causal(q_len: int, k_len: int) -> tuple[int | None, str | None]:
    """SDPA's ``is_causal`` aligns the mask top-left (query i sees keys j <= i); the kernel's is
    bottom-right. Returns (keys to keep, None) when slicing the keys makes them agree, else
    (None, reason)."""
    if q_len == k_len:
        return k_len, None  # the two alignments agree
    if q_len < k_len:
        return q_len, None  # keys past q_len are never seen top-left: drop them, then bottom-right is the same
    return None, f"top-left causal mask with more queries ({q_len}) than keys ({k_len})"
