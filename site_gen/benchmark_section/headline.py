"""A stage's headline numbers, for the top of its page: TFLOP/s at 8k, non-causal and causal, the
gain over the previous stage, and the ratio to the fastest reference peer timed in the same run as
this stage's entry (its `ratios`, written by the harness; runs are never mixed).

The fastest peer is the one with the highest median TFLOP/s in the entry's run, at its shape and
mask. It is not always the peer of the smallest ratio: a ratio is the median of the per-round
ratios, so two peers a few tenths of a per cent apart can swap between the two readings.
"""

from __future__ import annotations

from html import escape

from hopattn.records import results

SHAPE = "8k"
PEER_NAMES = {"fa3": "FlashAttention-3", "fa4": "FlashAttention-4", "cudnn": "cuDNN"}
STALE = '<span class="hd-stale" title="measured on older sources of this stage">stale</span>'


def best_peer(entry: dict, nums=None) -> tuple[str, float] | None:
    """(peer key, this entry's speed over it) for the fastest reference peer of the entry's run: the
    peer with the highest median TFLOP/s among the entry's ``ratios`` that ``nums`` (the GpuResults)
    holds from the same run, shape and mask. A later run may have replaced that run's peer entries
    in the file (the file keeps one entry per peer and shape); then the peer's speed in the entry's
    run is read from every stage entry of that run at that shape and mask, as the median of each
    one's TFLOP/s over its ratio to the peer (one entry alone would carry its own rounds' noise)."""
    ratios = (entry or {}).get("ratios") or {}
    if not ratios:
        return None

    def speed(key: str) -> float:
        peer = nums.peer(key, entry["shape"], entry["causal"]) if nums is not None else None
        if peer is not None and peer.get("status") == "ok" and peer.get("run_id") == entry.get("run_id"):
            return float(peer["tflops"])
        implied = sorted(e["tflops"] / e["ratios"][key] for e in (nums.data["results"] if nums is not None else [entry])
                         if e.get("kind") == "stage" and e.get("status") == "ok" and e.get("run_id") == entry.get("run_id")
                         and e.get("shape") == entry["shape"] and e.get("causal") == entry["causal"]
                         and (e.get("ratios") or {}).get(key))
        if not implied:
            return float(entry.get("tflops") or 0.0) / ratios[key] if ratios[key] else 0.0
        mid = len(implied) // 2
        return implied[mid] if len(implied) % 2 else (implied[mid - 1] + implied[mid]) / 2

    key = max(ratios, key=lambda k: (speed(k), -ratios[k], k))
    return key, ratios[key]


def peer_phrase(entry: dict, nums=None) -> str:
    best = best_peer(entry, nums)
    if best is None:
        return "no reference peer ran in its run"
    key, ratio = best
    return f"{ratio:.3f}× {PEER_NAMES.get(key, key)}, same run"


def _ok(e) -> bool:
    return e is not None and e.get("status") == "ok"


def card(stage, prev, hashes, nums, causal: bool) -> str | None:
    e = nums.stage(stage.id, SHAPE, causal)
    label = f"{SHAPE} {'causal' if causal else 'non-causal'}"
    if e is None:
        return None
    if not _ok(e):
        why = "no causal path in this stage" if causal and not stage.causal else (e.get("reason") or e["status"])
        return (f'<div class="hd-card hd-card-off"><div class="hd-card-head">{escape(label)}</div>'
                f'<div class="hd-card-note">{escape(why)}</div></div>')
    stale = STALE if results.is_stale(e, hashes[stage.id]) else ""
    lines = [f'<div class="hd-card-head">{escape(label)}</div>',
             f'<div class="hd-card-value">{e["tflops"]:.0f} <span>TFLOP/s</span>{stale}</div>']
    p = nums.stage(prev.id, SHAPE, causal) if prev is not None else None
    if _ok(p) and p["tflops"]:
        change = e["tflops"] / p["tflops"] - 1
        other = ", timed in another run" if p["run_id"] != e["run_id"] else ""
        cls = "hd-up" if change >= 0 else "hd-down"
        lines.append(f'<div class="hd-card-line"><span class="{cls}">{change * 100:+.1f} %</span> over stage '
                     f'{prev.id}{other}</div>')
    elif prev is not None and causal:
        lines.append('<div class="hd-card-line">the first causal stage</div>')
    lines.append(f'<div class="hd-card-line">{escape(peer_phrase(e, nums))}</div>')
    return '<div class="hd-card">' + "".join(lines) + "</div>"


def headline(stage, prev, hashes, all_results) -> str:
    """The cards as one HTML block (empty when nothing was measured)."""
    if not all_results:
        return ""
    nums = all_results[0]
    cards = [c for c in (card(stage, prev, hashes, nums, causal) for causal in (False, True)) if c]
    if not cards:
        return ""
    where = (f'<div class="hd-card-where">{escape(nums.gpu_name)}, bf16, head dim 128; '
             '<a href="#benchmark">every shape</a></div>')
    return '<div class="hd-cards">' + "".join(cards) + where + "</div>"
