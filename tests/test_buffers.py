"""``grow_rows``: capacity growth keeps the content and zero-pads, doubling by default or by a
given factor rounded up to an alignment (:data:`~torchbandits.buffers.SLOW_GROWTH`)."""

from __future__ import annotations

import torch

from torchbandits.buffers import SLOW_GROWTH, grow_rows


def test_doubling_by_default_and_no_copy_when_it_fits() -> None:
    buf = torch.arange(24, dtype=torch.float64).reshape(2, 4, 3)
    assert grow_rows(buf, 4, dims=(1,)) is buf
    out = grow_rows(buf, 5, dims=(1,))
    assert out.shape == (2, 8, 3)
    assert torch.equal(out[:, :4], buf) and not out[:, 4:].any()
    assert grow_rows(buf, 11, dims=(1,)).shape == (2, 11, 3)   # more than double: what is needed


def test_slow_growth_by_a_quarter_in_steps_of_sixteen() -> None:
    buf = torch.rand(3, 64, 64, dtype=torch.float64)
    out = grow_rows(buf, 65, dims=(1, 2), **SLOW_GROWTH)
    assert out.shape == (3, 80, 80)                             # 1.25·64 = 80 (not 128)
    assert torch.equal(out[:, :64, :64], buf)
    assert not out[:, 64:].any() and not out[:, :, 64:].any()
    sizes = [16]
    for _ in range(5):
        sizes.append(grow_rows(torch.zeros(sizes[-1]), sizes[-1] + 1, **SLOW_GROWTH).shape[0])
    assert sizes == [16, 32, 48, 64, 80, 112]                  # ⌈1.25·c⌉ up to a multiple of 16
