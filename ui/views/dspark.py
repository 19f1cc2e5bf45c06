"""DSpark (parallel drafting) views without streamlit: the lattice heatmap with the chosen chain or
tree drawn over it, the DP table, the stage-1 selection, the stage-2 verdicts, the cost-aware size
choice, chips, table rows and running metrics. Pure: DSparkRound events in, values/figures out.

Positions k are 1-based (as in the trace); candidates j are 0-based in the trace (0 = the drafter's most likely)
and shown from 1 (counted_from_1, the glossary's "counting"), on the heatmap's axis as in the tables.
Every string from a trace is escaped with figures.plot_text before it becomes a plotly label."""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from decoding.core import trace_totals
from decoding.core.trace import DSparkRound, proposed_by
from ui.views import palette
from ui.views.beam import dot_escape
from ui.views.chips import Chip, ngram_words, visible
from ui.views.figures import plot_text
from ui.views.glossary import counted_from_1
from ui.views.headers import header, value_word
from ui.views.sources import source_text
from ui.views.tables import table_short

NODE_STYLE = {   # verdict -> (colour, marker symbol, text twin)
    "accepted": (palette.GREEN, "circle", "✓ accepted"),
    "rejected": (palette.VERMILLION, "x", "✗ rejected"),
    "not_reached": (palette.GREY, "circle-open", "… not reached"),
}
NEXT_ORIGIN = {"residual": "residual", "argmax": "residual", "bonus": "bonus", "prefill": "target"}
NEXT_TEXT = {"residual": "residual resample (all children rejected)",
             "argmax": "target's argmax after a rejection (temperature 0)",
             "bonus": "bonus token (the accepted path reached a leaf of the plan)",
             "prefill": "first token, from the prompt's forward"}
VALUE_LABELS = {"score": f"{header('score')} (calibrated acceptance score)",
                "q_draft": f"{header('q_draft')} (drafter's probability)"}
MARK_SHIFT = 0.32         # node markers sit left of the cell centre, where the piece is written
ROOT_X = 0.3              # the root (the last emitted token) sits just left of position 1
HEAT_SCALE = "Cividis"       # perceptually uniform, readable with the common colour-vision deficiencies
TEXT_DARK_FROM = 0.55     # Cividis is light from about here up: cell text turns black
LOOKUP_FRAME = 0.44       # half-width of the frame drawn around a prompt-lookup cell (cells are 1 wide)
LOOKUP_LEGEND = "prompt lookup's token (framed)"
FRAMES = (   # (source, legend, half-width, line): the frames nest, so a cell several sources proposed shows each
    ("lookup", LOOKUP_LEGEND, LOOKUP_FRAME, {"color": palette.ORANGE, "width": 3}),
    ("recycling", "token recycling's (dashed frame)", LOOKUP_FRAME - 0.06,
     {"color": palette.SKY, "width": 2.5, "dash": "dash"}),
    ("suffix", "suffix matching's (dotted frame)", LOOKUP_FRAME - 0.12,
     {"color": palette.PURPLE, "width": 2.5, "dash": "dot"}),
    ("model", "the draft model's (dash-dot frame)", LOOKUP_FRAME - 0.18,
     {"color": palette.VERMILLION, "width": 2.5, "dash": "dashdot"}),
)


def _num(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.4f}" if x == 0 or abs(x) >= 1e-3 else f"{x:.2e}"


def drafting_rounds(events: Sequence) -> list:
    return [e for e in events if getattr(e, "kind", "") == "dspark_round" and not e.prefill]


def cell(event, k: int, j: int):
    """The lattice cell at position k (1-based), candidate j; None when there is none."""
    if not 1 <= k <= len(event.lattice):
        return None
    cells = event.lattice[k - 1].cells
    return cells[j] if 0 <= j < len(cells) else None


def piece_of(event, token_id: int) -> str:
    if token_id == event.next_token and event.next_piece:
        return event.next_piece
    for column in event.lattice:
        for c in column.cells:
            if c.token_id == token_id:
                return c.piece
    return f"⟨{token_id}⟩"


# ---------------------------------------------------------------- the lattice

def reference_parents(event) -> list[int | None]:
    """Per position k, the candidate at k−1 whose ŝ row the heatmap shows: the implicit root at
    k = 1, then the chosen chain (chain mode) or the tree's principal branch (at each depth the
    highest-survival child of the previous one). None past that path: the heatmap shows the
    largest ŝ over the parents there."""
    path = list(event.dp.path) if event.dp is not None else _principal_branch(event.nodes)
    out: list[int | None] = []
    for k in range(1, len(event.lattice) + 1):
        out.append(0 if k == 1 else (path[k - 2] if k - 2 < len(path) else None))
    return out


def _principal_branch(nodes) -> list[int]:
    path, current = [], 0
    while True:
        kids = [n for n in nodes if n.parent == current]
        if not kids:
            return path
        best = max(kids, key=lambda n: n.survival)
        path.append(best.cand)
        current = best.node


def cell_value(c, parent: int | None, value: str) -> float:
    if value == "q_draft":
        return c.q_draft
    if parent is None or parent >= len(c.scores):
        return max(c.scores)
    return c.scores[parent]


def lattice_grid(event, value: str = "score") -> dict:
    """z[j][k-1], the cell text (escaped pieces) and hover text for the heatmap; None where position
    k has fewer candidates than the widest one."""
    width = max((len(col.cells) for col in event.lattice), default=0)
    parents = reference_parents(event)
    z = [[None] * len(event.lattice) for _ in range(width)]
    text = [[""] * len(event.lattice) for _ in range(width)]
    hover = [[""] * len(event.lattice) for _ in range(width)]
    for k, column in enumerate(event.lattice, start=1):
        for c in column.cells:
            z[c.cand][k - 1] = cell_value(c, parents[k - 1], value)
            text[c.cand][k - 1] = plot_text(repr(visible(c.piece)))
            hover[c.cand][k - 1] = plot_text(_cell_hover(c, column, parents[k - 1]))
    return {"z": z, "text": text, "hover": hover, "x": list(range(1, len(event.lattice) + 1)),
            "y": list(range(1, width + 1))}     # candidate j drawn at j + 1


def _cell_hover(c, column, parent: int | None) -> str:
    given = "root" if c.position == 1 else ("max over parents" if parent is None else
                                            f"parent candidate {counted_from_1(parent)}")
    scores = ", ".join(_num(s) for s in c.scores)
    confs = ", ".join(_num(x) for x in column.confidence)
    source = f" | proposed by: {source_text(c)}" + (" (ŝ after its lookup parent: the run's lookup acceptance "
                                                     "rate)" if c.lookup else "")
    return (f"k={c.position} candidate {counted_from_1(c.cand)}: {visible(c.piece)!r} (id {c.token_id}) | "
            f"{header('q_draft')} "
            f"{_num(c.q_draft)} | ŝ per parent [{scores}] (shown: {given}) | confidence per parent [{confs}]{source}")


def node_points(event) -> list[dict]:
    """Each verified node's place on the heatmap: x = depth (left of the cell's centre, so the piece
    stays readable), y = candidate counted from 1 (nudged apart when several tree nodes share a cell through
    different parents), with its verdict."""
    shared: dict[tuple[int, int], list] = {}
    for n in event.nodes:
        shared.setdefault((n.depth, n.cand), []).append(n.node)
    points = []
    for n in event.nodes:
        group = shared[(n.depth, n.cand)]
        nudge = 0.0 if len(group) == 1 else (group.index(n.node) / (len(group) - 1) - 0.5) * 0.5
        points.append({"node": n.node, "parent": n.parent, "x": n.depth - MARK_SHIFT, "y": n.cand + 1 + nudge,
                       "verdict": n.verdict, "piece": n.piece, "token_id": n.token_id})
    return points


def lattice_figure(event, value: str = "score") -> go.Figure:
    """The lattice (position × candidate) as a heatmap of ŝ or q_draft with the pieces as cell text;
    the chosen chain/tree drawn over it: edges (the accepted path thick and solid, the rest dotted)
    and one marker per verified node whose colour, symbol and legend text give its verdict."""
    grid = lattice_grid(event, value)
    fig = go.Figure(go.Heatmap(z=grid["z"], x=grid["x"], y=grid["y"], customdata=grid["hover"],
                               hovertemplate="%{customdata}<br>value %{z:.4f}<extra></extra>",
                               colorscale=HEAT_SCALE, zmin=0, zmax=1, xgap=2, ygap=2, name=header(value),
                               colorbar={"title": {"text": header(value)}, "len": 0.8}))
    _add_pieces(fig, grid)
    _add_lookup_cells(fig, event)
    _add_edges(fig, event)
    _add_nodes(fig, event)
    mode = "chain (DP)" if event.select == "chain" else "tree (best-first)"
    fig.update_layout(title={"text": f"Round {event.index}: lattice {len(event.lattice)} positions × "
                                     f"{len(grid['y'])} candidates; {mode}: {len(event.nodes)} verified, "
                                     f"{len(event.accepted_path)} accepted<br>colour = "
                                     f"{VALUE_LABELS.get(value, value)}", "x": 0},
                      xaxis={"title": "draft position k", "dtick": 1},
                      yaxis={"title": "candidate (1 = drafter's top)", "dtick": 1, "autorange": "reversed"},
                      legend={"orientation": "h", "y": -0.25}, margin={"t": 50, "b": 10, "l": 10, "r": 10},
                      height=220 + 60 * max(1, len(grid["y"])))
    return fig


def _add_pieces(fig: go.Figure, grid: dict) -> None:
    """The pieces as cell text, dark on the light (high) end of the scale and light on the dark end."""
    xs, ys, texts, colors = [], [], [], []
    for j, row in enumerate(grid["z"]):
        for i, z in enumerate(row):
            if z is None:
                continue
            xs.append(grid["x"][i] + 0.1)
            ys.append(grid["y"][j] + 0.22)         # below the edges, which run through the centre
            texts.append(grid["text"][j][i])
            colors.append(palette.BLACK if z >= TEXT_DARK_FROM else "#FFFFFF")
    fig.add_scatter(name="pieces", x=xs, y=ys, text=texts, mode="text", textfont={"color": colors, "size": 13},
                    hoverinfo="skip", showlegend=False)


def _add_lookup_cells(fig: go.Figure, event) -> None:
    """A frame around each cell a source other than the trained drafter proposed: prompt lookup's solid
    orange, token recycling's dashed sky blue, suffix matching's dotted purple (colour and dash both tell)."""
    for name, legend, scale, style in FRAMES:
        cells = [c for column in event.lattice for c in column.cells if name in proposed_by(c)]
        xs, ys = [], []
        for c in cells:
            x0, x1 = c.position - scale, c.position + scale
            y0, y1 = c.cand + 1 - scale, c.cand + 1 + scale
            xs += [x0, x1, x1, x0, x0, None]
            ys += [y0, y0, y1, y1, y0, None]
        if cells:
            fig.add_scatter(name=legend, x=xs, y=ys, mode="lines", hoverinfo="skip", line=style)


def lookup_text(event, before: Sequence = ()) -> str:
    """Where prompt lookup matched this round (the matched tokens in words from the steps `before` it) and
    the acceptance rates its chain was scored with."""
    if not event.lattice:
        return "not used (no drafts this round)"
    if event.lookup_scores is None:
        return "off"
    first, later = event.lookup_scores
    rates = f"scored λ first {first:.2f}, λ next {later:.2f}"
    m = event.lookup
    if m is None:
        return f"no match ({rates})"
    return (f"the last {len(m.ngram)} token(s) {ngram_words(m.ngram, before)}, found at position "
            f"{counted_from_1(m.match_position)} of the text, copied from {counted_from_1(m.continuation_start)}; "
            f"{rates}")


def _edges(event) -> tuple[list, list]:
    """Parent -> child segments between node points, the root (the last emitted token, left of
    position 1) included: (accepted path, the rest)."""
    where = {p["node"]: p for p in node_points(event)}
    where[0] = {"node": 0, "parent": None, "x": ROOT_X, "y": 1}
    accepted = set(event.accepted_path) | {0}
    on, off = [], []
    for p in where.values():
        parent = where.get(p["parent"])
        if parent is None:
            continue
        target = on if p["node"] in accepted and p["parent"] in accepted else off
        target.append(((parent["x"], parent["y"]), (p["x"], p["y"])))
    return on, off


def _add_edges(fig: go.Figure, event) -> None:
    on, off = _edges(event)
    for name, segs, line in (("plan edge", off, {"color": palette.BLACK, "width": 1.5, "dash": "dot"}),
                             ("accepted path", on, {"color": palette.GREEN, "width": 4, "dash": "solid"})):
        if not segs:
            continue
        xs, ys = [], []
        for (x0, y0), (x1, y1) in segs:
            xs += [x0, x1, None]
            ys += [y0, y1, None]
        fig.add_scatter(name=name, x=xs, y=ys, mode="lines", line=line, hoverinfo="skip")
    if event.nodes:
        fig.add_scatter(name="root (last emitted token)", x=[ROOT_X], y=[1], mode="markers", hoverinfo="skip",
                        marker={"symbol": "square", "size": 12, "color": palette.BLACK})


def _add_nodes(fig: go.Figure, event) -> None:
    points = node_points(event)
    for verdict, (color, symbol, label) in NODE_STYLE.items():
        mine = [p for p in points if p["verdict"] == verdict]
        if not mine:
            continue
        fig.add_scatter(name=label, x=[p["x"] for p in mine], y=[p["y"] for p in mine], mode="markers",
                        marker={"symbol": symbol, "size": 14, "color": color,
                                "line": {"color": palette.BLACK, "width": 1.5}},
                        customdata=[plot_text(f"node {p['node']} (parent {p['parent']}): {visible(p['piece'])!r} "
                                                f"id {p['token_id']}") for p in mine],
                        hovertemplate="%{customdata}<br>" + label + "<extra></extra>")


# ---------------------------------------------------------------- a tree round drawn as a tree

TREE_STYLE = {   # verdict -> (border colour, DOT style, edge style, text twin)
    "accepted": (palette.GREEN, "filled,bold", "solid", "✓ accepted"),
    "rejected": (palette.VERMILLION, "filled,dashed", "dashed", "✗ rejected"),
    "not_reached": (palette.GREY, "filled,dotted", "dotted", "… not reached"),
}
DRAWINGS = {"tree": "the verified tree", "lattice": "the lattice (all candidates)"}   # a tree round's two views
TREE_FONT_PX = 14
TREE_LR_RANKS = 6   # a tree of up to this many ranks (root, depths, the next token) reads left to right; a deeper
                    # one top to bottom, so that it fits a projector's width without being scaled below 12 px
TREE_CAPTION = ("Each box: a verified draft token, its ŝ given its parent and its verdict; filled by that ŝ on the "
                "lattice's scale (dark blue = 0, yellow = 1). Border and edge: ✓ accepted green and bold, ✗ rejected "
                "vermillion and dashed, … not reached grey and dotted. The bold black path is what was emitted: the "
                "accepted drafts, then the target's own token (double octagon).")


def score_colors(score: float) -> tuple[str, str]:
    """The fill for ŝ on the lattice's colour scale (HEAT_SCALE) and the text colour readable on it."""
    from plotly.colors import sample_colorscale, unlabel_rgb

    rgb = unlabel_rgb(sample_colorscale(HEAT_SCALE, [min(1.0, max(0.0, score))])[0])
    linear = [(c / 255) / 12.92 if c <= 10 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]   # WCAG's relative luminance
    ink = palette.BLACK if luminance > 0.179 else "#FFFFFF"      # the text colour of the higher contrast
    return "#{:02X}{:02X}{:02X}".format(*(int(round(c)) for c in rgb)), ink


def _tree_node(n, on_path: bool) -> str:
    border, style, _, words = TREE_STYLE.get(n.verdict, TREE_STYLE["not_reached"])
    fill, ink = score_colors(n.score)
    label = "\\n".join(dot_escape(line) for line in (repr(visible(n.piece)), f"ŝ {n.score:.2f}", words))
    return (f'  n{n.node} [label="{label}", style="{style}", fillcolor="{fill}", fontcolor="{ink}", '
            f'color="{border}", penwidth={4 if on_path else 2}];')


def tree_dot(event) -> str:
    """The round's verified plan as a tree (left to right, or top to bottom when deep), DOT: the root (the
    last emitted token), each node under its parent, filled by its own ŝ (given that parent) on the lattice's
    scale, its token (escaped), ŝ and verdict in words, its border and edge telling the verdict (✓ bold,
    ✗ dashed, … dotted); the accepted path bold, ending in the token the target emitted after it (residual,
    bonus or argmax)."""
    accepted = set(event.accepted_path)
    depth = max((n.depth for n in event.nodes), default=0)
    lines = ["digraph tree {", f"  rankdir={'LR' if depth + 2 <= TREE_LR_RANKS else 'TB'};", "  nodesep=0.15;",
             "  ranksep=0.35;",
             f'  node [shape=box, fontname="sans-serif", fontsize={TREE_FONT_PX}];',
             f'  edge [color="{palette.GREY}"];',
             f'  n0 [label="last token", shape=box, style="filled", fillcolor="{palette.BLACK}", '
             'fontcolor="#FFFFFF"];']
    for n in event.nodes:
        on_path = n.node in accepted
        lines.append(_tree_node(n, on_path))
        edge = TREE_STYLE.get(n.verdict, TREE_STYLE["not_reached"])[2]
        lines.append(f"  n{n.parent} -> n{n.node} [style={edge}"
                     + (f', penwidth=4, color="{palette.BLACK}"];' if on_path else "];"))
    last = event.accepted_path[-1] if event.accepted_path else 0
    words = NEXT_TEXT.get(event.next_from, event.next_from).split(" (")[0]
    label = "\\n".join(dot_escape(line) for line in (repr(visible(piece_of(event, event.next_token))), words))
    color = palette.ORIGINS[NEXT_ORIGIN.get(event.next_from, "target")].color
    lines.append(f'  next [label="{label}", shape=doubleoctagon, style="filled", fillcolor="#FFFFFF", '
                 f'color="{color}", penwidth=3];')
    lines.append(f'  n{last} -> next [penwidth=4, color="{palette.BLACK}"];')
    lines.append("}")
    return "\n".join(lines)


# ---------------------------------------------------------------- stage 1: selection

DP_COLUMNS = ["k", "parent", "cand", "piece", "on_path", "score", "V", "back", "token_id"]   # a row's place first


def dp_table(event) -> pd.DataFrame:
    """Chain mode: V_k(x | parent) = ŝ_k(x | parent) · (1 + max_y V_{k+1}(y | x)) as recorded, with the
    back-pointer back_k(x) = argmax_y V_{k+1}(y | x) (None at the chain's last position). Candidates (cand,
    parent, back) counted from 1; parent 0 at k = 1 is the root, the last emitted token (as in the verdicts)."""
    rows = []
    dp = event.dp
    if dp is None:
        return pd.DataFrame(rows, columns=DP_COLUMNS).astype({"back": "Int64"})
    for k, table in enumerate(dp.values, start=1):
        for parent, row in enumerate(table):
            for j, v in enumerate(row):
                c = cell(event, k, j)
                on = j == dp.path[k - 1] and (k == 1 or parent == dp.path[k - 2])
                rows.append({"k": k, "parent": 0 if k == 1 else counted_from_1(parent), "cand": counted_from_1(j),
                             "token_id": c.token_id if c else None, "piece": visible(c.piece) if c else "",
                             "score": c.scores[parent] if c and parent < len(c.scores) else None, "V": v,
                             "back": counted_from_1(dp.back[k - 1][j]), "on_path": on})
    return pd.DataFrame(rows, columns=DP_COLUMNS).astype({"back": "Int64"})


def selection_summary(event, before: Sequence = ()) -> dict:
    """Stage 1 in numbers: what was drafted, what was chosen and what it was expected to give."""
    width = max((len(col.cells) for col in event.lattice), default=0)
    info = event.size
    return {"mode": "chain (DP)" if event.select == "chain" else "tree (best-first)",
            "positions drafted (γ)": len(event.lattice), "candidates per position (K)": width,
            ("chain length" if event.select == "chain" else "tree nodes") + " verified": len(event.nodes),
            "size": f"cost-aware: {info.size} (cost table {table_short(info.cost_source)})" if info else
                    "fixed (no cost table)",
            "expected accepted drafts": round(event.expected_accepted, 4),
            "expected tokens this forward": round(1.0 + event.expected_accepted, 4),
            "accepted drafts (measured)": len(event.accepted_path), "tokens emitted": len(event.emitted),
            "tokens fed to the target": event.fed_tokens,
            "prompt lookup": lookup_text(event, before),
            "lattice sources": ", ".join(sorted({source_text(c) for col in event.lattice for c in col.cells})) or "—",
            "acceptance": "LOSSY (threshold shortcut)" if event.lossy else "exact"}


def summary_table(event, before: Sequence = ()) -> pd.DataFrame:
    return pd.DataFrame([{"quantity": k, "value": str(v)} for k, v in selection_summary(event, before).items()],
                        columns=["quantity", "value"])


# ---------------------------------------------------------------- stage 2: verification

# The verdict and the numbers it came from first (a projector shows about seven columns; the rest of the row is
# behind the table's "More columns").
VERDICT_COLUMNS = ["node", "verdict", "piece", "source", "p_target", "p_accept", "u", "score", "parent", "depth",
                   "cand", "token_id", "q_draft", "survival"]


def verdicts_table(event) -> pd.DataFrame:
    """Every verified node (parents before children) and, last, the token emitted after the accepted
    path: residual, bonus or argmax, with its draw. Nodes are numbered from 1 in plan order, parent 0 is the
    root (the last emitted token); cand is the node's lattice candidate counted from 1."""
    rows = []
    for n in event.nodes:
        c = cell(event, n.depth, n.cand)
        rows.append({"node": n.node, "parent": n.parent, "depth": n.depth, "cand": counted_from_1(n.cand),
                     "token_id": n.token_id,
                     "piece": visible(n.piece), "q_draft": c.q_draft if c else None, "score": n.score,
                     "survival": n.survival, "p_target": n.p_target, "p_accept": n.p_accept, "u": n.draw,
                     "verdict": n.verdict, "source": source_text(n)})
    depth = len(event.accepted_path) + 1
    rows.append({"node": None, "parent": event.accepted_path[-1] if event.accepted_path else 0, "depth": depth,
                 "cand": None, "token_id": event.next_token, "piece": visible(piece_of(event, event.next_token)),
                 "q_draft": None, "score": None, "survival": None, "p_target": None, "p_accept": None,
                 "u": event.next_draw, "verdict": f"next: {event.next_from}", "source": "target"})
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS).astype({"node": "Int64", "cand": "Int64"})


def next_tooltip(event) -> str:
    parts = [f"id {event.next_token}", NEXT_TEXT.get(event.next_from, event.next_from)]
    parts.append(f"u {_num(event.next_draw)}" if event.next_draw is not None else "argmax (T=0)")
    parts.append(f"round {event.index}")
    return " · ".join(parts)


def node_tooltip(n, event) -> str:
    c = cell(event, n.depth, n.cand)
    parts = [f"id {n.token_id}", f"ŝ {_num(n.score)}", f"{header('q_draft')} {_num(c.q_draft if c else None)}",
             f"survival {_num(n.survival)}", f"{header('p_target')} {_num(n.p_target)}",
             f"{header('p_accept')} {_num(n.p_accept)}",
             f"u {_num(n.draw)}", f"node {n.node} depth {n.depth}", f"round {event.index}"]
    parts.insert(1, source_text(n))
    return " · ".join(parts)


# ---------------------------------------------------------------- chips and rows

def dspark_chips(event) -> list[Chip]:
    """Forced tokens; then along the accepted path, at each node its rejected children (struck
    through, not emitted; examined before the accepted one) and the accepted child; then the
    residual / bonus / argmax token. Cut where the round's emitted tokens end (EOS, budget)."""
    chips = [Chip(f"⟨{t}⟩", "forced", f"id {t} · forced by you · round {event.index}", event.index)
             for t in event.forced_ids]
    room = len(event.emitted) - len(event.forced_ids)
    by_node = {n.node: n for n in event.nodes}
    node = 0
    for child in list(event.accepted_path) + [None]:
        for n in event.nodes:
            if n.parent == node and n.verdict == "rejected":
                chips.append(Chip(n.piece, "rejected", node_tooltip(n, event) + " · rejected", event.index,
                                  emitted=False))
        if child is None or room <= 0:
            break
        chips.append(Chip(by_node[child].piece, "accepted", node_tooltip(by_node[child], event), event.index))
        room, node = room - 1, child
    if room > 0:
        chips.append(Chip(piece_of(event, event.next_token), NEXT_ORIGIN.get(event.next_from, "target"),
                          next_tooltip(event), event.index))
    return chips


def dspark_row(event) -> dict:
    return {"round": event.index, "position": counted_from_1(event.position), "prefill": event.prefill,
            "select": event.select,
            "positions": len(event.lattice), "verified": len(event.nodes), "accepted": len(event.accepted_path),
            "next_from": event.next_from, "next_piece": visible(piece_of(event, event.next_token)),
            "emitted": len(event.emitted), "expected_accepted": event.expected_accepted,
            "size": event.size.size if event.size is not None else None, "fed_tokens": event.fed_tokens,
            "lossy": event.lossy, "ms": sum(event.timings_ms.values())}


def dspark_metrics(events: Sequence) -> dict:
    """τ (tokens per verification forward), acceptance rate (accepted / verified nodes) and
    per-depth acceptance over the drafting rounds so far (decoding.core.trace_totals' dspark_metrics, as
    the engine's dspark_stats)."""
    stats = trace_totals.dspark_metrics([e for e in events if isinstance(e, DSparkRound)])
    return {"tau": stats.get("mean_accepted_length", 0.0), "acceptance_rate": stats.get("acceptance_rate"),
            "per_position": tuple(stats.get("per_position_acceptance", ())), "rounds": len(drafting_rounds(events))}


PHASES = ("drafter", "dp", "verification", "acceptance", "cache")


def phase_table(events: Sequence) -> pd.DataFrame:
    """Where the drafting rounds' time went, summed over the rounds so far (prefill excluded)."""
    totals: dict[str, float] = {}
    for e in drafting_rounds(events):
        for name, ms in e.timings_ms.items():
            totals[name] = totals.get(name, 0.0) + ms
    names = [p for p in PHASES if p in totals] + [p for p in totals if p not in PHASES]
    whole = sum(totals.values())
    rows = [{"phase": n, "ms": totals[n], "share": totals[n] / whole if whole > 0 else 0.0} for n in names]
    return pd.DataFrame(rows, columns=["phase", "ms", "share"])


def phase_bars(table: pd.DataFrame) -> go.Figure:
    colors = [palette.PHASE_COLORS[i % len(palette.PHASE_COLORS)] for i in range(len(table))]
    fig = go.Figure(go.Bar(x=list(table["share"]), y=[plot_text(value_word("phase", str(p))) for p in table["phase"]],
                           orientation="h",
                           marker_color=colors,
                           text=[f"{s:.0%} ({ms:.1f} ms)" for s, ms in zip(table["share"], table["ms"])],
                           textposition="outside", cliponaxis=False))
    fig.update_layout(title="Share of the drafting rounds' time per phase (so far)",
                      xaxis={"title": "share of time", "range": [0, 1.2], "tickformat": ".0%"},
                      yaxis={"autorange": "reversed"}, margin={"t": 50, "b": 10, "l": 10, "r": 10},
                      height=80 + 40 * max(1, len(table)))
    return fig


# ---------------------------------------------------------------- cost-aware size (adaptive γ)

SIZE_HEADERS = {"tokens_per_s": "expected tokens/s"}
SIZE_COLUMNS = ["size", "tokens_verified", "verify_ms", "round_ms", "expected_accepted", "expected_tokens",
                "tokens_per_s", "chosen"]


def size_table(info) -> pd.DataFrame:
    """Per candidate size (chain length or tree budget): the recorded verify cost of size + 1 tokens,
    the round's cost (that plus the round overhead), the expected accepted drafts and the expected
    tokens per second; the chosen size marked."""
    rows = []
    for size, (expected, rate) in enumerate(zip(info.expected_accepted, info.tokens_per_s), start=1):
        ms = info.verify_ms[size] if size < len(info.verify_ms) else None
        rows.append({"size": size, "tokens_verified": size + 1, "verify_ms": ms,
                     "round_ms": None if ms is None else ms + info.overhead_ms, "expected_accepted": expected,
                     "expected_tokens": 1.0 + expected, "tokens_per_s": rate, "chosen": size == info.size})
    return pd.DataFrame(rows, columns=SIZE_COLUMNS)


def cost_table(info) -> pd.DataFrame:
    return pd.DataFrame([{"tokens": n, "verify_ms": ms} for n, ms in enumerate(info.verify_ms, start=1)],
                        columns=["tokens", "verify_ms"])


def size_figure(info, select: str = "chain") -> go.Figure:
    """Expected tokens/s per size as bars (the chosen one green, hatched and labelled), the verify
    cost of each size on the right axis."""
    table = size_table(info)
    chosen = list(table["chosen"])
    fig = go.Figure()
    fig.add_bar(name="expected tokens/s (chosen: green, hatched)", x=list(table["size"]), y=list(table["tokens_per_s"]),
                marker={"color": [palette.GREEN if c else palette.SKY for c in chosen],
                        "pattern": {"shape": ["/" if c else "" for c in chosen]}},
                text=["chosen" if c else "" for c in chosen], textposition="outside", cliponaxis=False,
                hovertemplate="size %{x}<br>%{y:.1f} tokens/s<extra></extra>")
    fig.add_scatter(name="verify ms of size + 1 tokens (right axis)", x=list(table["size"]), y=list(table["verify_ms"]),
                    mode="lines+markers", yaxis="y2", line={"color": palette.BLACK, "dash": "dot"},
                    marker={"symbol": "diamond"})
    what = "chain length" if select == "chain" else "tree budget (nodes)"
    cost = f"(verify ms + {info.overhead_ms:.1f} ms overhead)" if info.overhead_ms else "verify ms"
    fig.update_layout(title=f"Cost-aware size: {what} {info.size} maximizes (1 + E[accepted]) / {cost}",
                      xaxis={"title": what, "dtick": 1}, yaxis={"title": "expected tokens/s"},
                      yaxis2={"title": header("verify_ms"), "overlaying": "y", "side": "right", "showgrid": False},
                      legend={"orientation": "h", "y": -0.3}, margin={"t": 50, "b": 10, "l": 10, "r": 10}, height=380)
    return fig
