"""The breakdown chart names its bars by the options that differ among them."""
from __future__ import annotations

import pandas as pd

from distsim.report.sweep_charts import breakdown_figure, breakdown_table
from distsim.report.sweep_labels import config_labels, split_options, value_text

OPTIONS = ["model", "topology", "tp", "pp", "micro_batch", "recompute", "fidelity"]


def points(rows):
    """A finished sweep frame: ``rows`` are (topology, tp, pp, micro_batch,
    recompute, fidelity, step seconds); the model is the same everywhere."""
    n = len(rows)
    df = pd.DataFrame(rows, columns=OPTIONS[1:] + ["step_time_s"])
    df.insert(0, "model", "gpt3-175b")
    df.insert(0, "key", [f"k{i}" for i in range(n)])
    df.insert(0, "index", range(n))
    df.insert(len(OPTIONS) + 2, "status", "ok")
    return df.assign(reason=None, samples_per_s=1536 / df["step_time_s"],
                     tokens_per_s=float("nan"), max_peak_memory_bytes=1e9,
                     oom=pd.array([False] * n, dtype="boolean"), resolved_global_batch=1536,
                     compute_s=df["step_time_s"] * 0.7, exposed_communication_s=0.0,
                     bubble_s=df["step_time_s"] * 0.3, idle_s=df["step_time_s"] * 0.3)


FRAME = points([
    ("dgx-a100-x128", 4, 8, 1, "none", "estimate", 24.0),
    ("dgx-a100-x128", 4, 8, 1, "selective", "simulate", 24.5),
    ("dgx-a100-x128", 8, 16, 2, "none", "estimate", 25.0),
    ("dgx-a100-x16", 8, 16, 2, "none", "estimate", 150.0),    # not among the best 3
])


def test_options_shared_by_the_shown_points_leave_the_labels():
    best3 = FRAME.head(3)
    differing, shared = split_options(best3, OPTIONS)
    assert differing == ["tp", "pp", "micro_batch", "recompute", "fidelity"]
    assert shared == ["model", "topology"]
    names = config_labels(best3, OPTIONS)
    assert names.shared == ["model=gpt3-175b", "topology=dgx-a100-x128"]
    assert names.header.split() == differing
    # aligned columns: every label as wide as the header, values in order
    assert [label.split() for label in names.labels] == [
        ["4", "8", "1", "none", "estimate"], ["4", "8", "1", "selective", "simulate"],
        ["8", "16", "2", "none", "estimate"]]
    assert {len(label) for label in names.labels} == {len(names.header)}
    for label in names.labels:
        assert "gpt3-175b" not in label and "dgx-a100" not in label and "=" not in label


def test_labels_stay_distinct_when_points_agree_on_every_option():
    twins = FRAME.iloc[[0, 0, 2]].assign(index=[0, 7, 2])
    names = config_labels(twins, OPTIONS)
    assert len(set(names.labels)) == 3
    assert names.header.split()[-1] == "#"
    assert [label.split()[-1] for label in names.labels] == ["0", "7", "2"]
    one = config_labels(FRAME.iloc[[1]], OPTIONS)
    assert one.header == "#" and one.labels == ["1"] and len(one.shared) == len(OPTIONS)
    # no index column when the options already tell the points apart
    assert "#" not in config_labels(FRAME, OPTIONS).header


def test_values_read_as_the_spec_gave_them():
    assert [value_text(v) for v in (4.0, 2.5, float("nan"), None, "none", True)] == \
        ["4", "2.5", "-", "-", "none", "True"]
    unset = FRAME.assign(dp=float("nan"))
    assert "dp=-" not in config_labels(unset, [*OPTIONS, "dp"]).shared


def test_breakdown_chart_says_shared_options_once_and_gives_the_bars_the_width():
    fig = breakdown_figure(FRAME, max_configs=3)
    ax = fig.axes[0]
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    names = config_labels(FRAME.head(3), OPTIONS)
    assert ticks == [names.header, *names.labels]            # header above the best bar
    assert "topology=dgx-a100-x128" in ax.get_title() and "model=gpt3-175b" in ax.get_title()
    assert "(best 3 of 4)" in fig.get_suptitle()
    assert [t.get_text() for t in ax.texts] == []            # every point fits
    marked = breakdown_figure(FRAME.assign(oom=pd.array([False, True, True, False],
                                                        dtype="boolean")), max_configs=3)
    # the points that fit lead (indices 0 and 3), then the best that does not
    assert [(t.get_text(), t.get_position()[1]) for t in marked.axes[0].texts] == \
        [(" OOM", 0)]                                        # the 3rd bar from the top
    assert list(breakdown_table(FRAME.assign(oom=[False, True, True, False]))["index"]) == \
        [0, 3, 1, 2]
    fig.canvas.draw()
    assert ax.get_position().width > 0.6                     # labels take the lesser part
