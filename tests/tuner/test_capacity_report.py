"""tuner/search/capacity_report.py: the capacity sweep's plots."""
from __future__ import annotations


def test_the_capacity_plot_takes_settings_that_mix_numbers_and_names(tmp_path):
    """num_speculative_tokens mixes 0, 2, 4 with "suffix:8": the plot puts one tick per
    value (numbers first) where numbers alone keep their own axis (a mixed axis crashed
    the sweep at its very end)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tuner.search.capacity_report import _axis, save_plots

    _, ax = plt.subplots()
    place = _axis(ax, [0, "suffix:8", 2, "suffix:16", 0])
    assert [place(v) for v in (0, 2, "suffix:16", "suffix:8")] == [0, 1, 2, 3]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "2", "suffix:16", "suffix:8"]
    assert _axis(ax, [16, 2.5, 64])(64) == 64
    plt.close("all")
    record = {"simulated": [{"params": {"num_speculative_tokens": k, "max_num_seqs": s},
                             "capacity": c}
                            for k, s, c in ((0, 8, 10.8), ("suffix:16", 58, 11.0),
                                            (4, 2, 10.3), (None, 4, None))],
              "arms": [{"label": "C1", "params": {"num_speculative_tokens": "suffix:8",
                                                  "max_num_seqs": 9}, "capacity": [10.6]}]}
    paths = save_plots(record, tmp_path)
    assert paths == [tmp_path / "capacity.png"] and paths[0].stat().st_size > 0
