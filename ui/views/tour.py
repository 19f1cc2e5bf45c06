"""The guided tour: its stops (text, prompt and decoding config) and the pre-recorded traces shipped in
assets/tour/ (bench/tour.py records them). No streamlit here (ui/widgets/tour_page.py draws the page)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from decoding.core.config import CONFIGS, BaseConfig
from decoding.core.errors import ConfigError, check
from decoding.core.trace import Trace, from_json
from decoding.core.trace_totals import emitted_count
from decoding.runtime.paths import TOUR_DIR
from ui.views.headers import value_word
from ui.views.made_with import settings_words

MAX_SHIPPED_BYTES = 300_000          # a shipped trace stays small (lower top_n or max_new_tokens if not)
MODEL = "default"                    # the traces are recorded on the embedded SmolLM2-135M-Instruct


@dataclass(frozen=True)
class Stop:
    id: str
    title: str
    terms: str                       # the story's Chinese terms for the idea
    body: str                        # Markdown, written here (never text from a trace)
    look_for: str                    # what to look at in the trace (Markdown)
    strategy: str
    params: tuple[tuple[str, Any], ...]
    prompt: str
    max_new_tokens: int = 40
    top_n: int = 5
    seed: int = 0
    focus: str = "first"             # which step is shown first (see focus_step)

    def config(self) -> BaseConfig:
        """The stop's validated config (ConfigError names a bad parameter, or an unknown strategy)."""
        check(self.strategy in CONFIGS, "strategy", self.strategy, f"choose one of {', '.join(CONFIGS)}")
        return CONFIGS[self.strategy](max_new_tokens=self.max_new_tokens, seed=self.seed,
                                      top_n=self.top_n, **dict(self.params))


COPY_TEXT = ("Speculative decoding lets a small drafter guess several tokens, and the large model checks "
             "them all in one forward pass.")
COPY_PROMPT = f'Repeat the following text: "{COPY_TEXT}"'
POEM_PROMPT = "Write a short poem about the sea."

STOPS: tuple[Stop, ...] = (
    Stop(
        id="serial",
        title="Why decoding is serial and memory-bound",
        terms="自回归解码 (autoregressive decoding) · 串行 (serial) · 内存受限 (memory-bound)",
        body=(
            "A language model does not write a sentence at once. It reads the text so far, outputs a "
            "probability for every token of its vocabulary, one token is picked and appended, and the "
            "model runs again on the longer text. The probability of the whole answer is the product of "
            "these one-step probabilities, `P(y | x) = Π_t P(y_t | x, y_<t)`, and that is the "
            "autoregressive loop.\n\n"
            "Token t+1 cannot be computed before token t exists, so N new tokens need N forward passes, "
            "one after another. Each of those passes does little arithmetic for one new position, but "
            "it must read every weight of every layer: about half a gigabyte for this 135M-parameter "
            "model in float32, tens of gigabytes for a large one. On a GPU the reading, not the "
            "arithmetic, sets the pace, which is why decoding is called memory-bound. The KV cache "
            "spares recomputing the keys and values of earlier tokens; it does not spare the forward "
            "pass of the new one.\n\n"
            "The next three stops change *which* token is picked. The last three get *more than one "
            "token* out of each expensive forward pass."),
        look_for=(
            "The metrics: **target forwards** equals **tokens** (the first forward also reads the "
            "prompt, the prefill). Each step's timing waterfall is almost all forward; choosing the "
            "token is a tiny slice."),
        strategy="greedy", params=(), prompt="List the days of the week.", max_new_tokens=32),
    Stop(
        id="greedy",
        title="Greedy search",
        terms="贪婪搜索 (greedy search)",
        body=(
            "Greedy search takes the most probable token at every step (the argmax). It is "
            "deterministic, costs nothing beyond the forward pass, and it is the reference that every "
            "exact speed-up later in the tour must reproduce token for token.\n\n"
            "Its weakness is that the best next token need not begin the best answer: one locally "
            "likely choice can lead into a dull or repetitive continuation, and small models "
            "easily fall into loops where the argmax keeps repeating a phrase."),
        look_for=(
            "The chosen token is always rank 0, and the draw reads *argmax*. The step shown first is the "
            "closest call of the run: the two best candidates nearly tie, and greedy hides that. The "
            "output repeats itself before the 40 tokens are up."),
        strategy="greedy", params=(), prompt=POEM_PROMPT, top_n=10, focus="closest"),
    Stop(
        id="beam",
        title="Beam search",
        terms="束搜索 (beam search) · 束宽 (beam width)",
        body=(
            "Beam search keeps the B best partial answers (beams), ranked by the sum of their tokens' "
            "log-probabilities. Each step extends every beam by every token, ranks the candidates and "
            "keeps the B best unfinished ones; a beam that ends (end-of-sequence) is set aside as a "
            "finished hypothesis, and the best finished one, with a length penalty, is the answer.\n\n"
            "It looks further ahead than greedy at B times the compute and B KV caches. It suits "
            "tasks with one right answer (translation, summaries) and tends to bland text in open "
            "chat. Here B = 3."),
        look_for=(
            "The tree: kept beams (solid), pruned candidates (dashed) and finished hypotheses (double "
            "octagon), with the answer's path in bold. The search goes on after the first hypothesis "
            "finishes; it stops once B hypotheses have finished and no live beam can still beat them."),
        strategy="beam", params=(("num_beams", 3),), prompt="What is the capital of France?",
        max_new_tokens=24, focus="last"),
    Stop(
        id="sampling",
        title="Temperature, top-k, top-p and min-p sampling",
        terms="采样 (sampling) · 温度 (temperature) · Top-k · Top-p 核采样 (nucleus sampling)",
        body=(
            "Sampling draws the next token at random from the model's distribution, after reshaping it "
            "(in this order, as transformers does):\n\n"
            "- **temperature** divides the logits: below 1 sharpens the distribution, above 1 "
            "flattens it;\n"
            "- **top-k** keeps the k most probable tokens;\n"
            "- **top-p** (nucleus) keeps the smallest set of most probable tokens whose probabilities "
            "add up to p, so it keeps few tokens when the model is sure and many when it is not;\n"
            "- **min-p** drops every token below min-p × the top token's probability.\n\n"
            "What is left is renormalised; a uniform number u picks the token whose cumulative "
            "probability first exceeds u. Same prompt as the greedy stop: the answer changes with the "
            "seed, and this one does not fall into the greedy loop. Here temperature 0.8, top-k 15, top-p 0.9, "
            "min-p 0.05, seed 0."),
        look_for=(
            "The bars, raw versus processed, with each removed token marked by the filter that removed "
            "it; the filter table with the mass each one cut; the draw u on the CDF. The step shown "
            "first is the one where the filters cut the most mass."),
        strategy="sample",
        params=(("temperature", 0.8), ("top_k", 15), ("top_p", 0.9), ("min_p", 0.05)),
        prompt=POEM_PROMPT, top_n=15, focus="most_cut"),
    Stop(
        id="speculative",
        title="Speculative decoding",
        terms="推测解码 (speculative decoding) · 草稿模型 (draft model) · 目标模型 (target model)",
        body=(
            "Checking tokens is cheaper than writing them. Because a forward pass is dominated by "
            "reading the weights, feeding the target model γ guessed tokens in one pass costs about as "
            "much as feeding one. So a cheap drafter proposes γ tokens, the target scores them all in one "
            "forward, and the guesses are accepted from left to right while they agree with the target: "
            "at temperature 0, while each one is the target's argmax; at temperature above 0, by a "
            "random test with probability min(1, p target ÷ q draft), which keeps the output "
            "distribution exactly the target's. At the first rejection the target's own token replaces "
            "the guess (the residual); when all γ pass, the same forward yields one more token for free "
            "(the bonus). Every round emits at least one token, and the answer is the one the target "
            "alone would give.\n\n"
            "The drafter can be a small model with the same vocabulary. Here it is **prompt lookup**: "
            "find the last few tokens earlier in the text and propose what followed them there. It costs "
            "nothing and hits whenever the answer copies its input (repeating, editing, rewriting). "
            "Here γ = 5."),
        look_for=(
            "The chips: accepted drafts, rejected drafts, residual and bonus tokens in their own colours. "
            "**Tokens per target forward** well above 1 is the speed-up. The round shown first emitted "
            "the most tokens; rounds with no drafts are where the lookup found no match."),
        strategy="speculative", params=(("draft", "lookup"), ("gamma", 5)), prompt=COPY_PROMPT,
        focus="most_emitted"),
    Stop(
        id="dspark",
        title="Parallel drafting with DP selection (DSpark)",
        terms="并行草稿 (parallel drafting) · 动态规划 (dynamic programming) · 两阶段验证 (two-stage verification)",
        body=(
            "A draft model still drafts one token at a time, and each guess waits for the one before "
            "it. DSpark drafts a lattice instead: γ positions × K candidates, each with a confidence ŝ, "
            "the drafter's calibrated chance that the candidate is accepted if the token before it "
            "was. A dynamic programme (DP) on the draft side picks the chain, or the small tree, with "
            "the largest expected number of accepted tokens (the sum over its nodes of the product of ŝ "
            "along each path); one target forward then verifies all of it with the exact rules of the "
            "previous stop.\n\n"
            "The candidates come from more than one source. A small trained head reads the target's own "
            "last hidden state (computed by the verification forward anyway) and steps along the "
            "lattice from the two likeliest candidates of each position, so position k's candidates "
            "depend on the candidate before them; a step "
            "costs about 2 ms against 35–60 for a forward of this model on a 2-core CPU. "
            "Prompt lookup adds the tokens that followed the last words earlier in the text, scored by "
            "how often it has been right so far in this run. Here DSpark runs with its defaults: γ = 8, "
            "K = 3, and a tree of at most 8 nodes, sized each round for the most expected tokens per "
            "millisecond with the verify times and the round's other costs profiled on the recording "
            "machine, on the same prompt as the speculative stop.\n\n"
            "The answer repeats a given text, so lookup carries it: 26 tokens take 9 target forwards "
            "(2.9 per forward), and the output is greedy's. The head alone (*lookup max ngram* = 0 on "
            "the Playground) gets 1.18 per forward here: it sees the target's state, not the prompt's "
            "words, so it cannot copy; on free writing it is the stronger source. On a model no "
            "trained head fits, token recycling (for each token, what the target itself guessed next "
            "the last time it read it) takes the head's place; the prefill step names the sources that "
            "ran, and each cell says which source proposed it."),
        look_for=(
            "The chosen tree, each node coloured by its ŝ with its verdict, the emitted path in bold; "
            "then the lattice behind it (one click: all candidates, lookup's outlined), and tokens per "
            "target forward against the speculative stop."),
        strategy="dspark", params=(),
        prompt=COPY_PROMPT, focus="most_emitted"),
    Stop(
        id="adaptive",
        title="Adaptive γ",
        terms="动态自适应策略 (adaptive policy) · 草稿长度 γ (draft length)",
        body=(
            "A fixed γ is a bet. On easy stretches (boilerplate, copied text) a longer draft would have "
            "been accepted; on hard ones most of a long draft is thrown away. An adaptive policy "
            "chooses γ round by round. The **heuristic** one used here (transformers' assisted generation "
            "has the same rule) adds 2 after a round whose drafts were all accepted and subtracts 1 "
            "otherwise, starting from γ = 2. Other policies: stop drafting when the drafter's own "
            "confidence drops, or, for DSpark, pick the draft size that maximises expected tokens per "
            "second under this device's measured verification cost.\n\n"
            "Same prompt as the speculative stop: the answer is the same (both are exact), only the "
            "rounds differ."),
        look_for=(
            "Each round's γ and *why* under the metrics, γ growing through the copied stretch and "
            "shrinking after rejections. The round shown first has the largest γ."),
        strategy="speculative",
        params=(("draft", "lookup"), ("gamma", 2), ("gamma_policy", "heuristic")),
        prompt=COPY_PROMPT, focus="largest_gamma"),
)


def stop_ids() -> list[str]:
    return [s.id for s in STOPS]


def stop_by_id(stop_id: str) -> Stop:
    for stop in STOPS:
        if stop.id == stop_id:
            return stop
    raise ConfigError("stop", stop_id, f"choose one of {', '.join(stop_ids())}")


def stop_label(stop_id: str) -> str:
    """The stop's number and title, as the selector and the page's header show it."""
    return f"{stop_ids().index(stop_id) + 1}. {stop_by_id(stop_id).title}"


def neighbour(stop_id: str, offset: int) -> str:
    """The stop `offset` places away, clamped to the first and last."""
    ids = stop_ids()
    i = min(max(ids.index(stop_id) + offset, 0), len(ids) - 1)
    return ids[i]


# ---------------------------------------------------------------- recorded traces

def trace_path(stop: Stop, root: Path | None = None) -> Path:
    return (TOUR_DIR if root is None else root) / f"{stop.id}.json"


def load_recorded(stop: Stop, root: Path | None = None) -> Trace | None:
    """The stop's shipped trace, or None when it is not recorded; TraceFormatError when unreadable."""
    path = trace_path(stop, root)
    if not path.is_file():
        return None
    return from_json(path.read_bytes())


def focus_step(stop: Stop, steps: Sequence) -> int:
    """Index of the step to show first, by the stop's rule."""
    if not steps:
        return 0
    score = _FOCUS_RULES.get(stop.focus)
    if score is None:
        return 0
    if stop.focus == "last":
        return len(steps) - 1
    return max(range(len(steps)), key=lambda i: (score(steps[i]), -i))


def _closeness(step) -> float:
    """Greedy: how close the two best raw candidates are (higher = closer call)."""
    top = getattr(step, "raw_top", ())
    return -(top[0].prob - top[1].prob) if len(top) >= 2 else float("-inf")


def _mass_cut(step) -> float:
    return sum(f.removed_mass for f in getattr(step, "filters", ()) if f.name != "temperature")


_FOCUS_RULES = {"closest": _closeness, "most_cut": _mass_cut, "most_emitted": emitted_count,
                "largest_gamma": lambda step: getattr(step, "gamma", 0), "last": lambda step: 0}


def speed_line(recorded: Trace | None, live: Trace) -> str:
    """The live run's speed beside the recording's, with where each ran."""
    def one(trace: Trace) -> str:
        return f"{trace.stats.tokens_per_s:.1f} tokens/s on {trace.model.get('device', '?')}"
    head = f"live {one(live)}"
    return head if recorded is None else f"{head}, recorded {one(recorded)} (the recording's machine)"


def facts(trace: Trace) -> str:
    """One line of what the trace measured."""
    s = trace.stats
    per_forward = s.new_tokens / s.target_forwards if s.target_forwards else 0.0
    model = trace.model
    return (f"{s.new_tokens} tokens from {s.target_forwards} target forwards ({per_forward:.2f} tokens per "
            f"forward), stop: {value_word('stop_reason', trace.stop_reason)}; model {model.get('name', '?')} on "
            f"{model.get('device', '?')}, {model.get('dtype', '?')}")


def stale_fields(stop: Stop, trace: Trace) -> list[str]:
    """What differs between the stop's settings and the trace recorded for it (empty when current)."""
    wanted = stop.config().to_dict()
    out = [k for k in wanted if wanted[k] != trace.config.get(k)]
    if set(trace.config) - set(wanted):
        out.append("other config fields")
    if trace.prompt_text != stop.prompt:
        out.append("prompt")
    return out


def playground_query(stop: Stop) -> dict[str, str]:
    """The stop's settings as the Playground's link parameters (ui/widgets/params.py's names); the model,
    device and dtype are left as the sidebar has them."""
    shared = {"prompt": stop.prompt, "chat": "1", "strategy": stop.strategy, "seed": str(stop.seed),
              "max_new": str(stop.max_new_tokens), "top_n": str(stop.top_n)}
    return {**shared, **{name: str(value) for name, value in stop.params}}


SPEED_NOTE = ("tokens/s depends on the machine (its cores, its load, the model's device and dtype): compare a "
              "live run with the recording in tokens per target forward, which does not")


def config_line(stop: Stop) -> str:
    """The stop's settings as the page shows them, in the sidebar's words (made_with.param_words): its own
    parameters, then the shared ones."""
    own = settings_words(stop.params)
    shared = settings_words((("max_new_tokens", stop.max_new_tokens), ("seed", stop.seed), ("top_n", stop.top_n)))
    return f"{stop.strategy}" + (f" with {own}" if own else "") + f"; {shared}; the rest at their defaults"
