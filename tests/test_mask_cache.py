"""A mask the diffusers glue reshapes before reading it is still read once while it lives and is not
written to: reading a mask ends in a device-to-host sync (bool(mask.all())), which a per-call reshape
must not repeat on every attention call (LTX-2's 2-D text masks)."""

import torch
from hopattn.integrations import diffusers as glue
from hopattn.integrations import masks


def _count(monkeypatch):
    calls = []
    real = masks._classify

    def counting(mask, q_len, k_len):
        calls.append(tuple(mask.shape))
        return real(mask, q_len, k_len)

    monkeypatch.setattr(masks, "_classify", counting)
    return calls


def _qk(q_len=8, k_len=12):
    return torch.zeros(2, q_len, 4, 16), torch.zeros(2, k_len, 4, 16)


def test_a_reshaped_mask_is_read_once(monkeypatch):
    calls = _count(monkeypatch)
    q, k = _qk()
    for mask in (torch.ones(2, 12, dtype=torch.bool), torch.ones(2, 8, 12, dtype=torch.bool)):
        first = glue._plan(q, k, mask, 0.0, False, False, None)
        for _ in range(5):
            assert glue._plan(q, k, mask, 0.0, False, False, None) == first
    assert calls == [(2, 1, 1, 12), (2, 1, 8, 12)]  # read as the 4-D broadcast, once each


def test_a_written_mask_is_read_again_and_its_verdict_follows(monkeypatch):
    calls = _count(monkeypatch)
    q, k = _qk()
    mask = torch.ones(2, 12, dtype=torch.bool)
    assert glue._plan(q, k, mask, 0.0, False, False, None)[2] is None  # all keys: served
    mask[0, 3] = False  # padding now: the version moves, the mask is read again
    assert glue._plan(q, k, mask, 0.0, False, False, None)[2].startswith("attention mask")
    assert len(calls) == 2
