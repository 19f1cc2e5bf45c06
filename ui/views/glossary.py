"""One glossary for every quantity the app shows (issue 46): one name and one short definition each. The
tables' column headers (ui/views/headers.py maps a trace's field to its name here), the charts' axis titles,
the column tooltips and the sidebar's glossary all read these words, so "acceptance probability" means the
same thing on every page. Pure: no streamlit.

A label counts as "from the glossary" when it is a name below, or a name with a unit or a note in
parentheses that the name's own entry does not carry (`is_term`)."""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    name: str
    definition: str


COUNTING = ("Every number that says where something is counts from 1: a draft position k, a rank, a candidate (1 = "
            "the drafter's top), a beam (1 = the best), a depth, a node of a plan, a token's position in the text "
            "(1 = the prompt's first token) and \"diverges at token\". 0 stands for the root of a plan (the last "
            "emitted token). Steps and rounds count from 0, as a trace and a link record them: step 0 is the "
            "first token (or DSpark's prefill).")


def steps_recorded(count: int, done: bool, cursor: int) -> str:
    """The Playground's run in one line, its numbering shown (steps count from 0, COUNTING):
    "14 steps recorded (finished), numbered 0–13; viewing step 13"."""
    state = "finished" if done else "in progress"
    if count <= 0:
        return f"No step recorded yet ({state})"
    numbered = "step 0" if count == 1 else f"numbered 0–{count - 1}"
    viewing = cursor if 0 <= cursor < count else "—"
    return f"{count} step{'s' if count != 1 else ''} recorded ({state}), {numbered}; viewing step {viewing}"


def counted_from_1(index: int | None) -> int | None:
    """A 0-based index of a trace (a candidate, a rank, a beam, a place in the text) as every page shows it:
    counted from 1 (COUNTING); None stays None (drawn "—")."""
    return None if index is None else int(index) + 1


RULE_GREEDY = "temperature 0: a draft is accepted exactly when it is the target's argmax (probability 1 or 0)"
RULE_SAMPLED = "sampled: a draft x is accepted with probability min(1, p target(x) ÷ q draft(x))"

# The quantities a student meets first, in the order the Tour introduces them; then the rest.
TERMS: tuple[Term, ...] = (
    Term("p target", "The target model's probability of a token, after the same temperature and filters as "
                     "the drafter's."),
    Term("q draft", "The drafter's probability of the token it proposed, after the same processing as the "
                    "target's; — for a drafter without a distribution (prompt lookup)."),
    Term("acceptance probability", "The probability with which the verifier accepted this draft under the rule "
                                   "it used: 1 or 0 at temperature 0 (accepted exactly when the draft is the "
                                   "target's argmax), min(1, p target ÷ q draft) for a sampled chain, p target "
                                   "after earlier siblings for a tree node."),
    Term("Σmin(p,q)", "Σₓ min(p target(x), q draft(x)): the chance that a sampled draft at this position is "
                      "accepted before the draft is drawn (1 − total-variation distance). What-if uses it as aᵢ "
                      "when the trace was sampled; at temperature 0 it is not the rule used."),
    Term("p target ÷ q draft", "The ratio a sampled draft's uniform u is compared with; accept while u < ratio."),
    Term("draw u", "The uniform random number the rule compared; — at temperature 0 (no draw)."),
    Term("p residual", "After a rejection, the next token is drawn from norm(max(0, p target − q draft)); its "
                       "probability there."),
    Term("ŝ", "The drafter's calibrated score: its estimate of P(this candidate is accepted | its parent was "
              "accepted). Stage 1 plans with ŝ alone, never with the target."),
    Term("survival (∏ ŝ)", "The product of ŝ from the root to this node: the drafter's estimate that the "
                           "whole path to it is accepted."),
    Term("τ (tokens per verification)", "Mean accepted length: tokens emitted per target verification forward "
                                        "(accepted drafts + 1), as vLLM defines it."),
    Term("acceptance rate", "Accepted draft tokens ÷ drafted tokens over the run."),
    Term("acceptance", "Per draft position: rounds in which that position was accepted ÷ rounds that "
                       "drafted it."),
    Term("expected accepted", "E[accepted drafts] = Σₖ Πᵢ≤ₖ aᵢ: the expected number of drafts accepted, from "
                              "per-position acceptance probabilities aᵢ (or ŝ for a plan)."),
    Term("speed vs greedy (×)", "Tokens per second of this lane ÷ tokens per second of plain greedy, measured "
                                "in the same process."),
    Term("tokens/s", "Tokens emitted per second of wall time; depends on the machine."),
    Term("γ", "Draft length: how many tokens a chain drafts per round."),
    Term("k (draft position)", "A draft's position in its round, 1 for the first drafted token."),
    Term("verdict", "What the verifier decided: accepted, rejected, or not reached (after an earlier "
                    "rejection)."),
    Term("V (expected accepted)", "The stage-1 DP's value: the expected accepted length from this candidate "
                                  "on, V = ŝ·(1 + best V of the next position)."),
    Term("entropy processed (nats)", "Entropy of the distribution the token was picked from, after temperature "
                                     "and filters."),
    Term("entropy raw (nats)", "Entropy of the model's distribution before temperature and filters."),
    Term("p processed", "The token's probability after temperature and filters: what it was picked from."),
    Term("p raw", "The token's probability before temperature and filters."),
    Term("log p", "Natural log of a token's probability."),
    Term("score (sum of log p)", "A beam's score: the sum of its tokens' log p."),
    Term("score ÷ length penalty", "A beam's score divided by length^penalty; finished beams are ranked by it."),
    Term("rank", "Place in the candidates' order, 1 for the most probable."),
    Term("counting", COUNTING),
    Term("position in the text", "A token's place in the prompt and output together, 1 for the prompt's first "
                                 "token; for a round or a beam step, that of its first new token."),
    Term("raw rank", "The picked token's place in the raw distribution, 1 for the most probable."),
    Term("mass removed", "Probability mass a filter removed."),
    Term("time (ms)", "Wall time of the step, in milliseconds; depends on the machine."),
    Term("wall time (s)", "Wall time of the run, in seconds; depends on the machine."),
    Term("tokens/s (wall time)", "Tokens emitted ÷ wall time of the run; depends on the machine."),
    Term("tokens/s (steps' time)", "Tokens emitted ÷ the steps' own time (model and bookkeeping, no page "
                                   "drawing)."),
    Term("tokens per target forward", "Tokens emitted ÷ target forward passes; 1 for greedy."),
    Term("target forwards", "Forward passes of the target model."),
    Term("rounds", "Draft–verify rounds counted."),
    Term("n", "How many measurements or rounds stand behind a number."),
    Term("samples", "How many drafts or draws stand behind a number."),
    Term("expected tokens per forward", "1 + expected accepted, averaged over the recorded rounds."),
    Term("expected acceptance rate", "Expected accepted drafts ÷ drafted tokens, from the recorded "
                                     "acceptance probabilities."),
    Term("expected ms per token", "Forecast ms per emitted token from the recorded cost table."),
    Term("measured (ms)", "Median time of a forward over its repeats, in milliseconds; depends on the "
                          "machine."),
    Term("spread (ms)", "Highest minus lowest time over the repeats of one forward: how far to trust the "
                        "median."),
    Term("repeats", "How many times one forward was timed."),
    Term("verify ÷ one-token forward", "Time to verify n tokens ÷ time of a one-token forward."),
    Term("τ to beat greedy", "The τ a round of this size needs to emit tokens faster than greedy."),
    Term("ECE raw", "Expected calibration error of the drafter's raw scores."),
    Term("ECE calibrated", "Expected calibration error after calibration."),
    Term("TV distance", "Total-variation distance between the observed and the target distribution."),
    Term("χ²", "Pearson's χ² statistic of the samples against the target distribution."),
    Term("p-value", "The chance of a χ² at least this large if the rule were lossless; below the cut-off "
                    "(significance level) the samples disagree with the target."),
    Term("probability", "A probability, between 0 and 1."),
    Term("share of rounds", "Rounds that ended with this token ÷ all seeded rounds."),
    Term("P(A)", "The worked example's probability that the next token is A."),
    Term("P(B)", "The worked example's probability that the next token is B."),
    Term("MB", "Megabytes (10⁶ bytes)."),
    Term("draft position k", "A draft's position in its round, 1 for the first drafted token."),
    Term("cumulative p", "Processed probabilities summed from the most probable token down to this one; "
                         "sampling picks the first token whose cumulative p exceeds u."),
    Term("model time", "Time spent in the model (forwards, drafting), in milliseconds; depends on the machine."),
    Term("search", "Whether beam search goes on after this step (running) or ends here (done)."),
    Term("tree budget", "How many draft nodes a tree round may send to the target."),
    Term("chain length", "How many draft tokens a chain round sends to the target (its γ)."),
    Term("ms since step start", "When a part of the step began and ended, in milliseconds from the step's "
                                "start; depends on the machine."),
    Term("target entropy (nats)", "Entropy of the target's distribution where a draft was judged."),
    # serving (the Requests page, the Lab's Queueing tab)
    Term("queue", "A served request's wait from its arrival to the start of its decoding."),
    Term("time to first token", "From a served request's arrival to its first token."),
    Term("inter-token latency", "The time between two steps of a served request that added tokens."),
    Term("end to end", "From a served request's arrival to the end of its decoding: queue + decoding."),
    Term("P99 latency", "The latency that 99 % of requests stay under (linear interpolation between ranks)."),
    Term("load", "How fast requests arrive, as a share of what one server can finish (1 ÷ mean service time)."),
    Term("P99, slower", "P99 latency of the slower strategy at that load; — past its capacity."),
    Term("P99, faster", "P99 latency of the strategy k× faster per request at that load; — past its capacity."),
    Term("P99 lower by", "P99 of the slower strategy ÷ P99 of the faster one at the same load."),
    Term("service, mean", "A request's decoding time alone, from the moment the server takes it to its end, "
                          "averaged over the requests served."),
    Term("load ρ", "Load as measured in a live queue: requests per second as they arrived × the mean service "
                   "time."),
    Term("P50 measured", "The latency (wait + decoding) that half the requests of a live queue stayed under."),
    Term("P99 measured", "The latency (wait + decoding) that 99 % of the requests of a live queue stayed under; "
                         "with few requests, nearly the slowest one."),
    Term("P99 simulated", "The simulation's P99 latency (4,000 seeded requests, Lindley's recursion) for the "
                          "service times a live queue measured at the rate its requests arrived; — at a load of "
                          "1 or more."),
    Term("requests", "How many requests a live queue served."),
    Term("arrival", "When a request entered the queue, in seconds after the first one."),
    Term("latency", "A request's wait in the queue plus its decoding, in seconds."),
)
GLOSSARY: dict[str, Term] = {t.name: t for t in TERMS}
assert len(GLOSSARY) == len(TERMS), "a glossary name appears twice"

_NOTE = re.compile(r"\s*\([^()]*\)$")


def definition(name: str) -> str | None:
    """The definition of a shown name (or of the name before its unit in parentheses), else None."""
    term = GLOSSARY.get(name) or GLOSSARY.get(_NOTE.sub("", name))
    return term.definition if term else None


def is_term(label: str, plain: frozenset[str] = frozenset()) -> bool:
    """Whether a label shown on a page is a glossary name (a defined term, or one of the `plain` names of
    headers.HEADERS), alone or with a unit/note in parentheses."""
    names = GLOSSARY.keys() | plain
    return label in names or _NOTE.sub("", label) in names


def sorted_terms() -> list[Term]:
    """The terms in alphabetical order, for the sidebar's glossary."""
    return sorted(TERMS, key=lambda t: t.name.lower())
