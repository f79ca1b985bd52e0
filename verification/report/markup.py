"""The dashboard's figure lists, in Markdown and in HTML: each drawn figure with its caption, then each figure that
was not drawn with the reason (the statements' figures, the sweep's and the LLM section's)."""

from __future__ import annotations

import html
from collections.abc import Mapping

__all__ = ["figures_markdown", "figures_html", "fmt"]


def fmt(t) -> str:
    """A number of the dashboard to 4 significant digits; a string as it is; None as a dash."""
    if t is None:
        return "–"
    if isinstance(t, str):
        return t
    return f"{t:.4g}"


def figures_markdown(figures: Mapping[str, str], missing: Mapping[str, str], *,
                     alt_chars: int | None = None) -> list[str]:
    """Markdown lines: ``![caption](figures/FILE)`` and the caption in italics per drawn figure (the alt text cut
    to ``alt_chars`` characters where given), then ``* figure `FILE` not drawn: why`` per missing one."""
    lines: list[str] = []
    for f, cap in figures.items():
        lines += [f"![{cap[:alt_chars]}](figures/{f})", "", f"*{cap}*", ""]
    lines += [f"* figure `{f}` not drawn: {why}" for f, why in missing.items()]
    return lines


def figures_html(figures: Mapping[str, str], missing: Mapping[str, str], *, alt_chars: int | None = None,
                 more: tuple[str, ...] = ()) -> list[str]:
    """HTML parts: a ``<figure>`` with its caption per drawn figure, then one list of the figures not drawn with
    why, followed by ``more`` (items already HTML), if there is any."""
    esc = html.escape
    parts = [f"<figure><img src='figures/{esc(f)}' alt='{esc(c[:alt_chars])}'><figcaption>{esc(c)}</figcaption>"
             "</figure>" for f, c in figures.items()]
    items = [f"figure <code>{esc(f)}</code> not drawn: {esc(w)}" for f, w in missing.items()] + list(more)
    if items:
        parts.append("<ul>" + "".join(f"<li>{e}</li>" for e in items) + "</ul>")
    return parts
