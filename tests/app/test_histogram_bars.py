"""The Data page's token-length histogram (issue 45 item 5: its bars were 1-px slivers): every bar is wide enough to
see, the counts are kept, and the bars stay in their lengths' order on the axis (app/model/data_preview.py)."""
from __future__ import annotations

import numpy as np

from app.model.data_preview import MIN_BAR_SHARE, MIN_ONE_BAR, histogram_bars


def _bars(lengths, seq_len=2048, bins=40):
    counts, edges = np.histogram(lengths, bins=bins)  # as the data report makes them
    return histogram_bars([float(e) for e in edges], [int(c) for c in counts], seq_len)


def test_many_narrow_bins_on_a_long_axis_are_merged_into_visible_bars():
    lengths = np.arange(10, 201)  # 40 bins of ~4.8 tokens on a 0…2,150 axis: 1/450 of it each
    x0, x1, heights, right = _bars(lengths)
    assert right >= 2048
    assert all(b - a >= right * MIN_ONE_BAR - 1e-9 for a, b in zip(x0, x1)), min(b - a for a, b in zip(x0, x1))
    assert sum(heights) == len(lengths) and len(heights) < 40
    assert x0 == sorted(x0) and all(b <= c + 1e-9 for b, c in zip(x1, x0[1:]))  # in order, none over another
    assert x0[0] <= 10 and x1[-1] >= 200  # the lengths stay where they are


def test_records_of_one_length_still_show_one_bar_and_wide_bins_are_left_alone():
    x0, x1, heights, right = _bars(np.full(50, 300))
    assert sum(heights) == 50 and max(x1) - min(x0) >= right * MIN_BAR_SHARE - 1e-9
    lengths = np.random.default_rng(0).integers(100, 4000, 500)
    counts, edges = np.histogram(lengths, bins=40)
    x0, x1, heights, _ = histogram_bars([float(e) for e in edges], [int(c) for c in counts], 2048)
    assert heights == [int(c) for c in counts] and np.allclose(x0, edges[:-1])
