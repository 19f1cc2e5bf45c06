"""What "readable on a projector" means for a page, as checks a browser test runs (issue 46, item 3): nothing
scrolls sideways (the page or a table's grid), no text is cut off with an ellipsis or clipped (metrics, buttons,
labels, tabs), no chart text is drawn below MIN_CHART_PX, and no chart title runs under the plotly toolbar.
Each check returns a list of problems in words (empty: none), so a failure names what and where."""
from __future__ import annotations

MIN_CHART_PX = 12        # the smallest text a chart may draw (issue 46: "≥ 12 px everywhere in charts")

# Elements whose text Streamlit cuts with an ellipsis (or clips) when their box is too narrow. An element counts
# when it is shown, holds text, and its content is wider than its box while its overflow is hidden or clipped.
CLIPPED_TEXT = r"""() => {
  const out = [];
  const seen = new Set();
  for (const el of document.querySelectorAll('[data-testid="stMain"] *, [data-testid="stSidebar"] *')) {
    if (!el.offsetParent || el.closest('.js-plotly-plot, [data-testid="stDataFrame"], [data-testid="stCode"], '
        + '[data-testid="stGraphVizChart"], .ds-chips, [data-testid="stTooltipContent"], textarea, input')) continue;
    const s = getComputedStyle(el);
    // an ellipsis shows as soon as the text is 1 px wider than its box; a hidden overflow clips visibly from 2 px
    const over = el.scrollWidth - el.clientWidth;
    const cut = (s.textOverflow === 'ellipsis' && over > 0) || (/hidden|clip/.test(s.overflowX) && over > 1);
    if (!cut || !el.innerText || !el.innerText.trim()) continue;
    if (el.clientWidth <= 1 || el.closest('[data-testid="stIconMaterial"]')) continue;   // screen-reader text, icons
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    const text = el.innerText.trim().slice(0, 60);
    if (seen.has(text)) continue;
    seen.add(text);
    out.push(`"${text}" (${el.getAttribute('data-testid') || el.tagName.toLowerCase()}: `
             + `${el.scrollWidth} px of text in ${el.clientWidth} px)`);
  }
  return out;
}"""

SIDEWAYS = r"""() => {
  const out = [];
  const doc = document.documentElement;
  if (doc.scrollWidth > doc.clientWidth + 1) out.push(`the page: ${doc.scrollWidth} px in ${doc.clientWidth} px`);
  const main = document.querySelector('[data-testid="stMain"]');
  if (main && main.scrollWidth > main.clientWidth + 1)
    out.push(`the main area: ${main.scrollWidth} px in ${main.clientWidth} px`);
  for (const el of document.querySelectorAll('[data-testid="stGraphVizChart"], [data-testid="stHorizontalBlock"]')) {
    if (el.offsetParent && el.scrollWidth > el.clientWidth + 1)
      out.push(`${el.getAttribute('data-testid')}: ${el.scrollWidth} px in ${el.clientWidth} px`);
  }
  document.querySelectorAll('[data-testid="stDataFrame"]').forEach((t, i) => {
    const grid = t.querySelector('.dvn-scroller');
    if (!grid || !t.offsetParent) return;
    const heads = [...t.querySelectorAll('th[role="columnheader"]')].map(h => h.innerText.trim()).slice(0, 4);
    if (grid.scrollWidth > grid.clientWidth + 1)
      out.push(`table ${i} [${heads.join(', ')}]: scrolls sideways, ${grid.scrollWidth} px in ${grid.clientWidth} px`);
    if (grid.scrollHeight > grid.clientHeight + 1)     // (the views checked hold tables of at most 40 rows)
      out.push(`table ${i} [${heads.join(', ')}]: scrolls inside itself, ${grid.scrollHeight} px in `
               + `${grid.clientHeight} px`);
  });
  return out;
}"""

SMALL_CHART_TEXT = r"""(minPx) => {
  const out = [];
  for (const svg of document.querySelectorAll('.js-plotly-plot svg.main-svg, [data-testid="stGraphVizChart"] svg')) {
    if (!svg.getBoundingClientRect().width) continue;
    for (const t of svg.querySelectorAll('text, tspan')) {
      const own = [...t.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent).join('').trim();
      if (!own || !t.getBoundingClientRect().width) continue;
      const ctm = t.getScreenCTM();
      const scale = ctm ? Math.hypot(ctm.a, ctm.b) : 1;
      const px = parseFloat(getComputedStyle(t).fontSize) * scale;
      if (px < minPx - 0.05) out.push(`"${own.slice(0, 30)}" at ${px.toFixed(1)} px`);
    }
  }
  return [...new Set(out)].slice(0, 20);
}"""

TITLE_UNDER_TOOLBAR = r"""() => {
  const out = [];
  for (const plot of document.querySelectorAll('.js-plotly-plot')) {
    const bar = plot.querySelector('.modebar');
    const title = plot.querySelector('.gtitle');
    if (!bar || !title || !title.getBoundingClientRect().width) continue;
    const a = bar.getBoundingClientRect(), b = title.getBoundingClientRect();
    const box = plot.getBoundingClientRect();
    if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom)
      out.push(`"${title.textContent.slice(0, 50)}" under the toolbar`);
    if (b.right > box.right + 1 || b.left < box.left - 1)
      out.push(`"${title.textContent.slice(0, 50)}" runs past the chart (${Math.round(b.width)} px title in `
               + `${Math.round(box.width)} px)`);
  }
  return out;
}"""


# The options of an open select box's list (drawn outside the main area, in a popover): none may be cut off.
OPTIONS_CLIPPED = r"""() => {
  const out = [];
  for (const option of document.querySelectorAll('[role="option"]')) {
    for (const el of [option, ...option.querySelectorAll('*')]) {
      if (!el.offsetParent || !el.innerText || !el.innerText.trim()) continue;
      const s = getComputedStyle(el);
      const over = el.scrollWidth - el.clientWidth;
      if ((s.textOverflow === 'ellipsis' && over > 0) || (/hidden|clip/.test(s.overflowX) && over > 1))
        out.push(`option "${el.innerText.trim().slice(0, 60)}": ${el.scrollWidth} px of text in ${el.clientWidth} px`);
    }
  }
  return [...new Set(out)];
}"""


def option_problems(page) -> list[str]:
    """The options of the select box whose list is open that are cut off, in words."""
    return page.evaluate(OPTIONS_CLIPPED)


def layout_problems(page) -> list[str]:
    """Every problem the page shows at its current window size, in words."""
    problems = [f"sideways: {p}" for p in page.evaluate(SIDEWAYS)]
    problems += [f"cut off: {p}" for p in page.evaluate(CLIPPED_TEXT)]
    problems += [f"chart text below {MIN_CHART_PX} px: {p}" for p in page.evaluate(SMALL_CHART_TEXT, MIN_CHART_PX)]
    problems += [f"chart title: {p}" for p in page.evaluate(TITLE_UNDER_TOOLBAR)]
    return problems
