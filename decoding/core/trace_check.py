"""Cross-reference checks of a loaded trace: every index a step holds (a beam's source, a tree node's
parent, a DP path's candidate, an accepted path's node, a γ choice's table row) points at something
the trace has, verdicts agree with their round's counts, the output and statistics are the steps'
(decoding.core.trace_totals), and every list is no longer than the engine can make it. One function per step kind,
called by decoding.core.trace.from_dict once the fields are typed; each problem raises TraceFormatError
with one line naming the field's path and the bad value. The views (ui/views) index a trace with these
guarantees, so a trace that loads cannot make them fail.

Steps are read by attribute and dispatched by `kind`, so this module needs nothing from trace.py.
"""
from __future__ import annotations

import math
from collections.abc import Iterator

from decoding.core import trace_totals
from decoding.core.config import (
    DSPARK_MAX_BUDGET,
    DSPARK_MAX_GAMMA,
    MAX_LOOKUP_NGRAM,
    MAX_NUM_BEAMS,
    MAX_TOP_K_CANDIDATES,
    MAX_TOP_N,
    MIN_TEMPERATURE,
    SPEC_MAX_GAMMA,
)

MAX_BEAMS = MAX_NUM_BEAMS
MAX_BEAM_POOL = 32 * MAX_BEAMS       # a pool is max(2, 1 + #EOS ids) x B: room for 31 EOS ids
MAX_LATTICE_CANDIDATES = MAX_TOP_K_CANDIDATES + 1   # plus prompt lookup's token
STEP_KIND = {"greedy": "token", "sample": "token", "beam": "beam", "speculative": "spec_round",
             "dspark": "dspark_round"}


class TraceFormatError(ValueError):
    """A trace file that cannot be loaded; the message says what is wrong and where."""


def _refuse(where: str, value, reason: str) -> TraceFormatError:
    return TraceFormatError(f"{where}={value!r:.60} {reason}")


def key_part(key) -> str:
    """An object key as part of a path: `.name`, or `['any text']` quoted and shortened."""
    if isinstance(key, str) and key.isidentifier() and len(key) <= 60:
        return f".{key}"
    return f"[{key!r:.60}]"


def _cap(where: str, items, most: int, what: str) -> None:
    if len(items) > most:
        raise TraceFormatError(f"{where}: {len(items)} {what} is over the limit of {most}")


def _index(where: str, value: int, size: int, what: str) -> None:
    """`value` must index a list of `size` items (`what` names that list)."""
    if not 0 <= value < size:
        raise _refuse(where, value, f"is out of range ({f'0 to {size - 1}' if size else 'none'}: {what})")


def check_trace(trace) -> None:
    """The strategy is known (and the config's, where it names one, is the same), every step is of its
    kind, numbered by its place, and passes its kind's checks; then the totals (check_totals)."""
    kind = STEP_KIND.get(trace.strategy)
    if kind is None:
        raise _refuse("trace.strategy", trace.strategy, f"is not a strategy: expected one of {', '.join(STEP_KIND)}")
    if trace.config.get("strategy", trace.strategy) != trace.strategy:
        raise _refuse("trace.config.strategy", trace.config["strategy"],
                      f"is not the trace's strategy {trace.strategy!r}")
    check = STEP_CHECKS[kind]
    minor = _minor(trace.schema_version)
    prev = None
    for i, step in enumerate(trace.steps):
        where = f"trace.steps[{i}]"
        if step.kind != kind:
            raise _refuse(f"{where}.kind", step.kind,
                          f"does not belong to a {trace.strategy} trace (expected {kind!r})")
        if step.index != i:
            raise _refuse(f"{where}.index", step.index, f"is not the step's place in trace.steps ({i})")
        _check_timings(where, step.timings_ms)
        _check_kv(f"{where}.kv", step.kv)
        check(step, prev, where)
        _check_fields_of_version(where, step, minor, trace.schema_version)
        prev = step
    check_totals(trace)


def _minor(version) -> int:
    """The minor part of a "major.minor" version (from_dict checked its form); a large number otherwise."""
    try:
        return int(str(version).split(".")[1])
    except (IndexError, ValueError):
        return 1 << 30


def _later_fields(step) -> Iterator[tuple[int, str]]:
    """(the minor version that added it, its name) for each field `step` records that schema 1.0 did not have
    (the history in decoding.core.trace.SCHEMA_VERSION)."""
    if getattr(step, "kv", None) is not None:
        yield 3, "kv"
    if step.kind == "spec_round":
        yield from ((2, "gamma_choice"),) * (step.gamma_choice is not None)
        yield from ((3, f"drafts[{k}].target_entropy") for k, d in enumerate(step.drafts)
                    if d.target_entropy is not None)
        yield from ((6, "drafting"),) * (step.drafting is not None)
    elif step.kind == "dspark_round":
        yield from ((1, "lookup"),) * (step.lookup is not None or step.lookup_scores is not None)
        for k, column in enumerate(step.lattice):
            for j, cell in enumerate(column.cells):
                yield from ((1, f"lattice[{k}].cells[{j}].lookup"),) * cell.lookup
                yield from ((5, f"lattice[{k}].cells[{j}].sources"),) * bool(cell.sources)
        for i, node in enumerate(step.nodes):
            yield from ((1, f"nodes[{i}].lookup"),) * node.lookup
            yield from ((3, f"nodes[{i}].target_entropy"),) * (node.target_entropy is not None)
            yield from ((5, f"nodes[{i}].sources"),) * bool(node.sources)
        yield from ((4, "size.overhead_ms"),) * (step.size is not None and step.size.overhead_ms != 0)
        yield from ((5, "drafting"),) * (step.drafting is not None)
    drafting = getattr(step, "drafting", None)
    yield from ((7, "drafting.memory"),) * bool(drafting is not None and drafting.memory)


def _check_fields_of_version(where: str, step, minor: int, version: str) -> None:
    """A trace records only the fields its schema version has: one of 1.5 carrying a field 1.6 added was
    written by something else than it says."""
    for added, name in _later_fields(step):
        if added > minor:
            raise TraceFormatError(f"{where}.{name}: is a field of schema 1.{added}; this trace says "
                                   f"schema_version {version!r}")


def check_totals(trace) -> None:
    """The top-level record agrees with the steps: output_ids are the tokens they emitted (beam search:
    the best hypothesis), beginning with forced_ids; the stats count them and the steps' target
    forwards, and a recorded speculative metric is the steps' (decoding.core.trace_totals); an empty
    output has empty text; an error message goes with stop_reason 'error' and nothing else."""
    out = trace_totals.output_ids(trace.steps)
    _check_ids("trace.output_ids", trace.output_ids, out, ("the steps' token", "the new tokens the steps emitted"))
    _check_ids("trace.forced_ids", trace.forced_ids[:len(out)], out[:len(trace.forced_ids)],
               ("output_ids' token", "the output begins with the forced tokens"))
    stats = trace.stats
    if stats.new_tokens != len(out):
        raise _refuse("trace.stats.new_tokens", stats.new_tokens, f"is not the {len(out)} tokens of output_ids")
    forwards = trace_totals.target_forwards(trace.steps)
    if stats.target_forwards != forwards:
        raise _refuse("trace.stats.target_forwards", stats.target_forwards, f"is not the steps' {forwards}")
    for name, unit in (("wall_s", "a duration (s)"), ("tokens_per_s", "a rate (tokens/s)")):
        if not getattr(stats, name) >= 0:
            raise _refuse(f"trace.stats.{name}", getattr(stats, name), f"is not {unit} >= 0")
    _check_metrics(stats, trace_totals.metrics(trace.steps))
    if not out and trace.text:
        raise _refuse("trace.text", trace.text, "is not empty, but output_ids is")
    _check_error(trace.stop_reason, trace.error)


def _check_ids(where: str, recorded, want: list[int], what: tuple[str, str]) -> None:
    """`recorded` must be `want`; what: (the name of one wanted token, what `want` is)."""
    if list(recorded) == want:
        return
    for i, (got, token) in enumerate(zip(recorded, want)):
        if got != token:
            raise _refuse(f"{where}[{i}]", got, f"is not {what[0]} {token} ({what[1]})")
    raise TraceFormatError(f"{where}: has {len(recorded)} tokens; expected {len(want)}, {what[1]}")


def _check_metrics(stats, want: dict) -> None:
    """A metric recorded (not null) is the steps' value: null for strategies without drafting rounds."""
    for name in trace_totals.METRIC_NAMES:
        got, expected = getattr(stats, name), want.get(name)
        if got is not None and not _same(got, expected):
            raise _refuse(f"trace.stats.{name}", got, f"is not the steps' value ({expected!r:.60})")


def _same(got, expected) -> bool:
    if isinstance(got, tuple) and isinstance(expected, tuple):
        return len(got) == len(expected) and all(_same(a, b) for a, b in zip(got, expected))
    if isinstance(got, float) and isinstance(expected, (int, float)):
        return math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12)
    return got == expected


def _check_error(stop_reason: str, error) -> None:
    if stop_reason == "error" and not error:
        raise _refuse("trace.error", error, "holds no message, but stop_reason is 'error'")
    if error is not None and stop_reason != "error":
        raise _refuse("trace.error", error, f"is a message, but stop_reason is {stop_reason!r}, not 'error'")
    if error is not None and len(error.splitlines()) > 1:
        raise _refuse("trace.error", error, "is not one line")


def _check_timings(where: str, timings: dict) -> None:
    for name, ms in timings.items():
        if not 0 <= ms < math.inf:
            raise _refuse(f"{where}.timings_ms{key_part(name)}", ms, "is not a duration (a finite number of ms >= 0)")


def _check_kv(where: str, kv) -> None:
    """Sizes are counts (>= 0); a peak is at least what is held after it, and freed is their difference."""
    if kv is None:
        return
    for name in ("bytes", "tokens", "sequences", "freed_bytes"):
        if getattr(kv, name) < 0:
            raise _refuse(f"{where}.{name}", getattr(kv, name), "is not a size (an integer >= 0)")
    if kv.peak_bytes is None:
        if kv.freed_bytes:
            raise _refuse(f"{where}.freed_bytes", kv.freed_bytes, "needs peak_bytes (it is peak_bytes - bytes)")
    elif kv.peak_bytes - kv.bytes != kv.freed_bytes:
        raise _refuse(f"{where}.freed_bytes", kv.freed_bytes,
                      f"is not peak_bytes - bytes ({kv.peak_bytes} - {kv.bytes})")


# ---------------------------------------------------------------- greedy and sampling

def check_token(step, prev, where: str) -> None:
    """raw_top and processed_top: the same 1..MAX_TOP_N tokens, ranked by raw logit, the first one the
    most probable after processing (the views measure the other candidates from it); the chosen token's
    log-probabilities are <= 0; a temperature cut holds a temperature."""
    raw, proc = step.raw_top, step.processed_top
    if not raw:
        raise TraceFormatError(f"{where}.raw_top: is empty; a token step records at least its top candidate")
    _cap(f"{where}.raw_top", raw, MAX_TOP_N, "candidates")
    if len(proc) != len(raw):
        raise TraceFormatError(f"{where}.processed_top: has {len(proc)} candidates; expected {len(raw)}, "
                               "the raw_top tokens")
    for i, (r, p) in enumerate(zip(raw, proc)):
        if p.token_id != r.token_id:
            raise _refuse(f"{where}.processed_top[{i}].token_id", p.token_id,
                          f"is not raw_top[{i}]'s token {r.token_id}")
        if i and r.logit > raw[i - 1].logit:
            raise _refuse(f"{where}.raw_top[{i}].logit", r.logit,
                          f"is above raw_top[{i - 1}]'s {raw[i - 1].logit!r}: candidates are ranked best first")
        if p.prob > proc[0].prob:
            raise _refuse(f"{where}.processed_top[{i}].prob", p.prob,
                          f"is above processed_top[0]'s {proc[0].prob!r}: the top candidate is always kept")
    for name in ("chosen_logprob", "chosen_raw_logprob"):
        if not getattr(step, name) <= 0.0:
            raise _refuse(f"{where}.{name}", getattr(step, name), "is not a log-probability (<= 0)")
    for i, cut in enumerate(step.filters):
        if cut.name == "temperature" and not cut.value >= MIN_TEMPERATURE:
            raise _refuse(f"{where}.filters[{i}].value", cut.value,
                          f"is not a temperature (must be >= {MIN_TEMPERATURE:g})")


# ---------------------------------------------------------------- beam search

def check_beam(step, prev, where: str) -> None:
    """Sources and parents are beams of the previous step (at step 0 one of the search's num_beams
    rows: the prompt's, or one that starts dead, which only a vocabulary smaller than the pool
    reaches); the kept candidates are the live beams; hypotheses finished at a step so far."""
    if not 1 <= step.num_beams <= MAX_BEAMS:
        raise _refuse(f"{where}.num_beams", step.num_beams, f"is out of range (1 to {MAX_BEAMS})")
    _cap(f"{where}.pool", step.pool, MAX_BEAM_POOL, "candidates")
    _cap(f"{where}.beams", step.beams, step.num_beams, "live beams (num_beams)")
    _cap(f"{where}.finished", step.finished, step.num_beams, "hypotheses (num_beams)")
    rows, what = (step.num_beams, "the search's rows at step 0") if prev is None \
        else (len(prev.beams), "the previous step's live beams")
    for r, cand in enumerate(step.pool):
        _index(f"{where}.pool[{r}].source_beam", cand.source_beam, rows, what)
    for j, beam in enumerate(step.beams):
        _index(f"{where}.beams[{j}].parent", beam.parent, rows, what)
    kept = sum(cand.status == "kept" for cand in step.pool)
    if kept != len(step.beams):
        raise TraceFormatError(f"{where}.beams: {len(step.beams)} live beams, but {kept} pool candidates are kept")
    for h, hyp in enumerate(step.finished):
        _index(f"{where}.finished[{h}].step", hyp.step, step.index + 1, "the steps so far")


# ---------------------------------------------------------------- speculative decoding

def check_spec(step, prev, where: str) -> None:
    """Drafts numbered 0..n-1 (n <= SPEC_MAX_GAMMA); 0 <= accepted <= gamma <= n; new tokens at most the
    accepted drafts plus one; top-N lists within MAX_TOP_N; the γ choice's tables line up."""
    drafts = step.drafts
    _cap(f"{where}.drafts", drafts, SPEC_MAX_GAMMA, "drafts (SPEC_MAX_GAMMA)")
    for k, draft in enumerate(drafts):
        if draft.index != k:
            raise _refuse(f"{where}.drafts[{k}].index", draft.index, f"is not the draft's place in drafts ({k})")
        _cap(f"{where}.drafts[{k}].target_top", draft.target_top, MAX_TOP_N, "candidates")
        _cap(f"{where}.drafts[{k}].draft_top", draft.draft_top, MAX_TOP_N, "candidates")
    if not 0 <= step.gamma <= len(drafts):
        raise _refuse(f"{where}.gamma", step.gamma, f"is out of range: the round recorded {len(drafts)} drafts")
    if not 0 <= step.accepted <= step.gamma:
        raise _refuse(f"{where}.accepted", step.accepted, f"is out of range (0 to gamma={step.gamma})")
    _check_new_tokens(where, step, step.accepted, "accepted drafts")
    for k, draft in enumerate(drafts):
        want = draft_verdict(k, step.gamma, step.accepted)
        if draft.verdict != want:
            raise _refuse(f"{where}.drafts[{k}].verdict", draft.verdict,
                          f"is not {want!r} (gamma={step.gamma}, accepted={step.accepted})")
    if (step.final_kind == "none") != (step.final_id is None):
        raise _refuse(f"{where}.final_id", step.final_id,
                      f"does not go with final_kind {step.final_kind!r} (null exactly when it is 'none')")
    _cap(f"{where}.final_top", step.final_top, MAX_TOP_N, "candidates")
    _cap(f"{where}.residual_top", step.residual_top, MAX_TOP_N, "candidates")
    _check_lookup(where, step.lookup)
    if step.gamma_choice is not None:
        _check_gamma_choice(f"{where}.gamma_choice", step.gamma_choice)
    if step.drafting is not None and prev is not None:
        raise TraceFormatError(f"{where}.drafting: recorded on a later round; only the first round carries it")
    _check_drafting(where, step.drafting)


def draft_verdict(k: int, gamma: int, accepted: int) -> str:
    """The verdict of draft k of a speculative round that verified `gamma` drafts and accepted `accepted`."""
    if k >= gamma:
        return "recorded"
    if k < accepted:
        return "accepted"
    return "rejected" if k == accepted else "not_reached"


def _check_new_tokens(where: str, step, accepted: int, what: str) -> None:
    new = len(step.emitted) - len(step.forced_ids)
    if new > accepted + 1:
        raise TraceFormatError(f"{where}.emitted: {new} new tokens after the forced ones; "
                               f"at most {accepted + 1} ({accepted} {what} and one more)")


def _check_lookup(where: str, lookup) -> None:
    if lookup is not None:
        _cap(f"{where}.lookup.ngram", lookup.ngram, MAX_LOOKUP_NGRAM, "tokens (MAX_LOOKUP_NGRAM)")


def _check_gamma_choice(where: str, info) -> None:
    """Per γ = 1..N: acceptance, expected tokens and ms per token; verify_ms covers N + 1 tokens."""
    n = len(info.expected_tokens)
    if not 1 <= n <= SPEC_MAX_GAMMA:
        raise TraceFormatError(f"{where}.expected_tokens: has {n} entries; expected 1 to {SPEC_MAX_GAMMA}")
    for name in ("acceptance", "ms_per_token"):
        if len(getattr(info, name)) != n:
            raise TraceFormatError(f"{where}.{name}: has {len(getattr(info, name))} entries; expected {n}, "
                                   "one per γ of expected_tokens")
    if not n + 1 <= len(info.verify_ms) <= SPEC_MAX_GAMMA + 1:
        raise TraceFormatError(f"{where}.verify_ms: has {len(info.verify_ms)} entries; expected {n + 1} to "
                               f"{SPEC_MAX_GAMMA + 1} (1 to γ + 1 tokens)")
    if not 1 <= info.gamma <= n:
        raise _refuse(f"{where}.gamma", info.gamma, f"is out of range: the table covers γ = 1 to {n}")


# ---------------------------------------------------------------- dspark

def check_dspark(step, prev, where: str) -> None:
    """The lattice (positions 1..γ, γ <= DSPARK_MAX_GAMMA), the DP table, the verified tree and the
    accepted path all refer to one another consistently; sizes within the config's limits."""
    if step.prefill != (step.next_from == "prefill"):
        raise _refuse(f"{where}.next_from", step.next_from, f"does not go with prefill={step.prefill} "
                                                            "('prefill' exactly on the prefill round)")
    if step.prefill and (step.lattice or step.nodes):
        raise TraceFormatError(f"{where}: the prefill round has {len(step.lattice)} lattice positions and "
                               f"{len(step.nodes)} nodes; it drafts nothing")
    _check_lattice(where, step.lattice)
    widths = [len(column.cells) for column in step.lattice]
    if step.dp is not None:
        _check_dp(f"{where}.dp", step.dp, widths)
    _check_nodes(where, step.nodes, step.lattice)
    _check_accepted_path(where, step.accepted_path, step.nodes)
    _check_new_tokens(where, step, len(step.accepted_path), "accepted nodes")
    if step.size is not None:
        _check_size(f"{where}.size", step.size)
    _check_lookup(where, step.lookup)
    if step.lookup_scores is not None and len(step.lookup_scores) != 2:
        raise TraceFormatError(f"{where}.lookup_scores: has {len(step.lookup_scores)} entries; expected 2")
    if step.drafting is not None and not step.prefill:
        raise TraceFormatError(f"{where}.drafting: recorded on a drafting round; only the prefill round carries it")
    _check_sources(where, step)


MAX_SOURCES = 8                      # lattice sources named by one cell or run
MAX_SOURCE_NAME = 40                 # characters of a source's name
MAX_DRAFTING_REASON = 300            # characters of a run's `drafting.reason`


def _source_names(where: str, names) -> None:
    _cap(where, names, MAX_SOURCES, "sources")
    for i, name in enumerate(names):
        if not 1 <= len(name) <= MAX_SOURCE_NAME:
            raise _refuse(f"{where}[{i}]", name, f"is not a source name (1 to {MAX_SOURCE_NAME} characters)")


def _cell_sources(where: str, item) -> None:
    """A lattice cell's or plan node's sources: named as above and, where recorded, naming prompt lookup when its
    `lookup` flag (on prompt lookup's chain) is set (a trace older than 1.5 has the flag alone; lookup may also
    propose a token off its chain, so the flag is not needed for the name)."""
    _source_names(f"{where}.sources", item.sources)
    if item.sources and item.lookup and "lookup" not in item.sources:
        raise _refuse(f"{where}.sources", list(item.sources), "does not go with lookup=True (a token on prompt "
                      "lookup's chain was proposed by lookup)")


def _check_sources(where: str, step) -> None:
    """Source names: at most MAX_SOURCES per cell, node and run, each 1..MAX_SOURCE_NAME characters."""
    for k, column in enumerate(step.lattice):
        for j, cell in enumerate(column.cells):
            _cell_sources(f"{where}.lattice[{k}].cells[{j}]", cell)
    for i, node in enumerate(step.nodes):
        _cell_sources(f"{where}.nodes[{i}]", node)
    _check_drafting(where, step.drafting)


def _check_drafting(where: str, drafting) -> None:
    """A run's sources (a DSpark prefill round's or a first speculative round's `drafting`): named as cells'
    sources are, the reason and memory within MAX_DRAFTING_REASON characters."""
    if drafting is None:
        return
    _source_names(f"{where}.drafting.sources", drafting.sources)
    for field in ("reason", "memory"):
        if len(getattr(drafting, field)) > MAX_DRAFTING_REASON:
            raise TraceFormatError(f"{where}.drafting.{field}: {len(getattr(drafting, field))} characters is "
                                   f"over the limit of {MAX_DRAFTING_REASON}")


def _check_lattice(where: str, lattice) -> None:
    """Column k (0-based) is position k + 1; its cells are candidates 0..K-1 of distinct tokens; each
    cell has one score (and the column one confidence) per candidate of the previous position (one at
    position 1)."""
    _cap(f"{where}.lattice", lattice, DSPARK_MAX_GAMMA, "positions (DSPARK_MAX_GAMMA)")
    parents = 1
    for k, column in enumerate(lattice):
        here = f"{where}.lattice[{k}]"
        if column.position != k + 1:
            raise _refuse(f"{here}.position", column.position, f"is not the column's position ({k + 1})")
        cells = column.cells
        if not cells:
            raise TraceFormatError(f"{here}.cells: is empty; a lattice position has at least one candidate")
        _cap(f"{here}.cells", cells, MAX_LATTICE_CANDIDATES, "candidates")
        if len(column.confidence) != parents:
            raise TraceFormatError(f"{here}.confidence: has {len(column.confidence)} entries; expected {parents}, "
                                   "one per candidate of the previous position")
        seen = set()
        for j, cell in enumerate(cells):
            if cell.position != k + 1 or cell.cand != j:
                field, value, want = ("position", cell.position, k + 1) if cell.position != k + 1 \
                    else ("cand", cell.cand, j)
                raise _refuse(f"{here}.cells[{j}].{field}", value, f"is not the cell's place ({want})")
            if len(cell.scores) != parents:
                raise TraceFormatError(f"{here}.cells[{j}].scores: has {len(cell.scores)} entries; expected "
                                       f"{parents}, one per candidate of the previous position")
            if cell.token_id in seen:
                raise _refuse(f"{here}.cells[{j}].token_id", cell.token_id, "repeats a candidate of this position")
            seen.add(cell.token_id)
        parents = len(cells)


def _check_dp(where: str, dp, widths: list[int]) -> None:
    """Chain DP over positions 1..L (L <= γ): values[k] is (parents, K_k), back[k][j] a candidate of
    position k + 2 (None at the last position), path[k] a candidate of position k + 1."""
    length = len(dp.values)
    if not 1 <= length <= len(widths):
        raise TraceFormatError(f"{where}.values: covers {length} positions; expected 1 to the lattice's {len(widths)}")
    for name in ("back", "path"):
        if len(getattr(dp, name)) != length:
            raise TraceFormatError(f"{where}.{name}: has {len(getattr(dp, name))} entries; expected {length}, "
                                   "one per position of values")
    for k in range(length):
        parents = 1 if k == 0 else widths[k - 1]
        table = dp.values[k]
        if len(table) != parents or any(len(row) != widths[k] for row in table):
            raise TraceFormatError(f"{where}.values[{k}]: is not a {parents} x {widths[k]} table "
                                   "(previous position's candidates x this position's)")
        if len(dp.back[k]) != widths[k]:
            raise TraceFormatError(f"{where}.back[{k}]: has {len(dp.back[k])} entries; expected {widths[k]}")
        for j, b in enumerate(dp.back[k]):
            if k == length - 1:
                if b is not None:
                    raise _refuse(f"{where}.back[{k}][{j}]", b, "must be null at the chain's last position")
            elif b is None:
                raise _refuse(f"{where}.back[{k}][{j}]", b, "must be a candidate of the next position")
            else:
                _index(f"{where}.back[{k}][{j}]", b, widths[k + 1], f"the candidates of lattice position {k + 2}")
        _index(f"{where}.path[{k}]", dp.path[k], widths[k], f"the candidates of lattice position {k + 1}")


def _check_nodes(where: str, nodes, lattice) -> None:
    """Node i (1-based, in list order) has an earlier parent (0 = the root), depth = parent's + 1 within
    the lattice, and a candidate of that position whose token it carries."""
    _cap(f"{where}.nodes", nodes, DSPARK_MAX_BUDGET, "nodes (DSPARK_MAX_BUDGET)")
    depth = [0]
    for i, node in enumerate(nodes, start=1):
        here = f"{where}.nodes[{i - 1}]"
        if node.node != i:
            raise _refuse(f"{here}.node", node.node, f"is not the node's place ({i}: nodes are numbered from 1)")
        _index(f"{here}.parent", node.parent, i, f"the root 0 or a node before node {i}")
        if node.depth != depth[node.parent] + 1:
            raise _refuse(f"{here}.depth", node.depth, f"is not its parent's depth + 1 ({depth[node.parent] + 1})")
        if node.depth > len(lattice):
            raise _refuse(f"{here}.depth", node.depth, f"is beyond the lattice's {len(lattice)} positions")
        cells = lattice[node.depth - 1].cells
        _index(f"{here}.cand", node.cand, len(cells), f"the candidates of lattice position {node.depth}")
        if node.token_id != cells[node.cand].token_id:
            raise _refuse(f"{here}.token_id", node.token_id,
                          f"is not lattice position {node.depth}'s candidate {node.cand} ({cells[node.cand].token_id})")
        depth.append(node.depth)


def _check_accepted_path(where: str, path, nodes) -> None:
    """A path down the tree from the root through nodes with verdict accepted."""
    parent = 0
    for i, node in enumerate(path):
        here = f"{where}.accepted_path[{i}]"
        if not 1 <= node <= len(nodes):
            raise _refuse(here, node, f"is not a node of the round (1 to {len(nodes)})" if nodes
                          else "is not a node: the round verified none")
        plan = nodes[node - 1]
        if plan.parent != parent:
            raise _refuse(here, node, f"is not a child of {'the root' if parent == 0 else f'node {parent}'} "
                                      f"(its parent is {plan.parent})")
        if plan.verdict != "accepted":
            raise _refuse(here, node, f"has verdict {plan.verdict!r}, not 'accepted'")
        parent = node
    on_path = set(path)
    for i, plan in enumerate(nodes):
        if plan.verdict == "accepted" and plan.node not in on_path:
            raise _refuse(f"{where}.nodes[{i}].verdict", plan.verdict, f"but node {plan.node} is not on accepted_path")


def _check_size(where: str, info) -> None:
    """Per size 1..N (N <= DSPARK_MAX_BUDGET): expected accepted and tokens/s; the chosen size among them."""
    n = len(info.expected_accepted)
    _cap(f"{where}.expected_accepted", info.expected_accepted, DSPARK_MAX_BUDGET, "sizes (DSPARK_MAX_BUDGET)")
    if len(info.tokens_per_s) != n:
        raise TraceFormatError(f"{where}.tokens_per_s: has {len(info.tokens_per_s)} entries; expected {n}, "
                               "one per size of expected_accepted")
    if not 1 <= info.size <= n:
        raise _refuse(f"{where}.size", info.size, f"is out of range: the table covers sizes 1 to {n}")
    if not 0 <= info.overhead_ms < math.inf:
        raise _refuse(f"{where}.overhead_ms", info.overhead_ms, "is not a duration (finite ms >= 0)")


STEP_CHECKS = {"token": check_token, "beam": check_beam, "spec_round": check_spec, "dspark_round": check_dspark}
