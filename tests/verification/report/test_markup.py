"""The dashboard's figure lists (verification.report.markup)."""

from __future__ import annotations

from verification.report.markup import figures_html, figures_markdown


def test_markdown_lists_the_figures_then_those_not_drawn():
    lines = figures_markdown({"a.png": "A caption"}, {"b.png": "no data"}, alt_chars=3)
    assert lines == ["![A c](figures/a.png)", "", "*A caption*", "", "* figure `b.png` not drawn: no data"]
    assert figures_markdown({}, {}) == []


def test_html_escapes_cuts_the_alt_text_and_adds_the_other_items_to_one_list():
    parts = figures_html({"a<.png": "x & y"}, {"b.png": "<none>"}, alt_chars=1, more=("study <code>s</code>",))
    assert parts == ["<figure><img src='figures/a&lt;.png' alt='x'><figcaption>x &amp; y</figcaption></figure>",
                     "<ul><li>figure <code>b.png</code> not drawn: &lt;none&gt;</li><li>study <code>s</code></li></ul>"]
    assert figures_html({"a.png": "c"}, {}) == ["<figure><img src='figures/a.png' alt='c'><figcaption>c</figcaption>"
                                                "</figure>"]
