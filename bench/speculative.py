"""Speculative benchmark: our prompt lookup and draft-model speculative decoding vs plain greedy, and vs
transformers' prompt-lookup / assisted generation with the same draft, interleaved in one process.

    python -m bench speculative [--repeats R] [--max-new-tokens N] [--gamma G] [--draft-layers L]
                                [--device cuda --dtype bfloat16 --fast-path --prompts N --md FILE]

Prompts use the chat template. transformers' assisted generation gives the assistant no attention mask,
so it hides every token equal to the pad id; SmolLM2's pad id is <|im_end|>, which the chat template
uses, so the benchmark sets the pad id to <|endoftext|> (id 0, absent from the prompts) for generate.
The draft model is the shipped shallow self-draft (decoding/drafters/shallow.py) when its weights exist, else
the target's first L layers, untrained (`--draft-layers`); it runs alone and behind prompt lookup
(`lookup+`), at γ, at γ = 2 and with the cost-aware γ policy (γ ≤ 8, the auto verify-cost table).
After the runs, the target's and the draft's forwards are timed to give the τ each γ needs to match
(and to beat by 1.2×) plain greedy on this machine.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench import model_options
from bench.interleave import interleaved
from bench.memory import NOTE as MEMORY_NOTE
from bench.memory import mib_cell
from bench.prompts import PROMPTS
from bench.report import machine, spread
from decoding import runner
from decoding.core.config import GreedyConfig, SpeculativeConfig
from decoding.core.formulas import break_even_tau, round_ms
from decoding.drafters.draft_model import truncated_draft
from decoding.drafters.feature import FeatureDrafter
from decoding.drafters.feature_net import DEFAULT_FEATURE, load_feature
from decoding.drafters.shallow import DEFAULT_SHALLOW, load_shallow
from decoding.runtime.cost_table import profile_verify_cost


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _ours(lm, ids, cfg, **kw):
    tr, wall = _timed(lambda: runner.run(lm, ids, cfg, **kw))
    return len(tr.output_ids), wall, tr.stats


def _generate(lm, ids, max_new, **kw):
    x = torch.tensor([ids], device=lm.device)
    with torch.inference_mode():
        out, wall = _timed(lambda: lm.model.generate(x, do_sample=False, max_new_tokens=max_new, **kw))
    return out.shape[1] - len(ids), wall, None


def feature_contenders(lm, feature, args) -> dict:
    """The feature drafter (decoding/drafters/feature_net.py) alone and behind prompt lookup, at γ and cost-aware."""
    n, g = args.max_new_tokens, args.gamma
    run = lambda draft, **kw: (lambda ids: _ours(lm, ids, SpeculativeConfig(max_new_tokens=n, draft=draft, **kw),
                                                 drafter=feature))
    return {f"feature drafter γ={g} (ours)": run("feature", gamma=g),
            f"lookup + feature drafter γ={g} (ours)": run("lookup+feature", gamma=g),
            f"feature drafter cost-aware γ≤{COST_MAX_GAMMA} (ours)": run("feature", gamma=COST_MAX_GAMMA,
                                                                          gamma_policy="cost"),
            f"lookup + feature drafter cost-aware γ≤{COST_MAX_GAMMA} (ours)": run(
                "lookup+feature", gamma=COST_MAX_GAMMA, gamma_policy="cost")}


def contenders(lm, draft, args, feature=None) -> dict:
    n, g = args.max_new_tokens, args.gamma
    draft.model.generation_config.num_assistant_tokens = g
    draft.model.generation_config.num_assistant_tokens_schedule = "constant"
    draft.model.generation_config.assistant_confidence_threshold = 0.0
    return {
        "greedy (ours)": lambda ids: _ours(lm, ids, GreedyConfig(max_new_tokens=n)),
        "lookup (ours)": lambda ids: _ours(lm, ids, SpeculativeConfig(max_new_tokens=n, gamma=10, draft="lookup")),
        "lookup (generate)": lambda ids: _generate(lm, ids, n, prompt_lookup_num_tokens=10),
        f"{draft.name} γ={g} (ours)": lambda ids: _ours(
            lm, ids, SpeculativeConfig(max_new_tokens=n, gamma=g, draft="model"), drafter=draft),
        f"{draft.name} γ={g} (generate assisted)": lambda ids: _generate(
            lm, ids, n, assistant_model=draft.model),
        f"lookup + {draft.name} γ={g} (ours)": lambda ids: _ours(
            lm, ids, SpeculativeConfig(max_new_tokens=n, gamma=g, draft="lookup+model"), drafter=draft),
        **({} if g == SMALL_GAMMA else {
            f"{draft.name} γ={SMALL_GAMMA} (ours)": lambda ids: _ours(
                lm, ids, SpeculativeConfig(max_new_tokens=n, gamma=SMALL_GAMMA, draft="model"), drafter=draft),
            f"lookup + {draft.name} γ={SMALL_GAMMA} (ours)": lambda ids: _ours(
                lm, ids, SpeculativeConfig(max_new_tokens=n, gamma=SMALL_GAMMA, draft="lookup+model"),
                drafter=draft)}),
        f"{draft.name} cost-aware γ≤{COST_MAX_GAMMA} (ours)": lambda ids: _ours(
            lm, ids, SpeculativeConfig(max_new_tokens=n, gamma=COST_MAX_GAMMA, draft="model", gamma_policy="cost"),
            drafter=draft),
        f"lookup + {draft.name} cost-aware γ≤{COST_MAX_GAMMA} (ours)": lambda ids: _ours(
            lm, ids, SpeculativeConfig(max_new_tokens=n, gamma=COST_MAX_GAMMA, draft="lookup+model",
                                       gamma_policy="cost"), drafter=draft),
        **({} if feature is None else feature_contenders(lm, feature, args)),
        "greedy (generate)": lambda ids: _generate(lm, ids, n),
    }


def break_even(verify_ms, draft_ms: float, gammas) -> list[dict]:
    """Per γ: the τ at which a round (γ draft tokens, one forward over γ + 1) costs as much per token
    as plain greedy (one 1-token forward each), and the τ that 1.2× greedy's speed needs. Bookkeeping
    outside the forwards is left out, so these are lower bounds."""
    greedy_ms = verify_ms[0]
    rows = []
    for g in gammas:
        cost = round_ms(verify_ms[g], g, draft_ms)
        rows.append({"gamma": g, "verify_ms": verify_ms[g], "round_ms": cost,
                     "tau_parity": break_even_tau(cost, greedy_ms), "tau_1_2": break_even_tau(cost, greedy_ms, 1.2),
                     "tau_max": g + 1})
    return rows


def cost_rows(lm, draft, max_gamma: int = 8, rounds: int = 3) -> tuple[list[dict], float, float]:
    """break_even rows from measured forwards (the target's over 1..max_gamma + 1 new tokens, the
    draft's over one; per count the median of `rounds` alternating profiles, so that one slow spell
    of the machine does not set a row), with the draft's and the target's 1-token ms."""
    targets, drafts = [], []
    for _ in range(rounds):
        targets.append(profile_verify_cost(lm, max_gamma + 1, repeats=7).verify_ms)
        drafts.append(profile_verify_cost(draft, 1, repeats=15).verify_ms[0])
    verify = [statistics.median(col) for col in zip(*targets)]
    draft_ms = statistics.median(drafts)
    return break_even(verify, draft_ms, range(1, max_gamma + 1)), draft_ms, verify[0], verify


COST_MAX_GAMMA = 8  # the cost policy's largest γ (its table: the auto one, profiled once and cached)
SMALL_GAMMA = 2   # also run: a 3-token verify costs little more than 1 token where 4+ tokens jump (CPU)


def measure(lm, draft, args, feature=None) -> dict:
    runs = contenders(lm, draft, args, feature)
    rows = {name: {"tps": [], "tau": [], "acc": [], "peak": []} for name in runs}
    encoded = [lm.encode(p) for p in model_options.first(PROMPTS, args).values()]
    for model in (lm.model, draft.model):
        model.generation_config.pad_token_id = 0  # see the module docstring
    for results in interleaved(runs, encoded, args.repeats, lm.device):
        for name, r in results.items():
            rows[name]["peak"].append(r.peak_mib)
            rows[name]["tps"].append(r.speed)
            stats = r.extra
            if stats is not None and stats.mean_accepted_length is not None:
                rows[name]["tau"].append(stats.mean_accepted_length)
                rows[name]["acc"].append(stats.acceptance_rate or 0.0)
    return rows


def draft_note(args) -> str:
    if DEFAULT_SHALLOW.is_file():
        return ("the shipped shallow self-draft (assets/shallow-draft-smollm2-135m.safetensors; target layers "
                "shared + trained adapter, sliced head), the same model object for ours and assisted generation")
    return f"the target's first {args.draft_layers} layers, untrained (no shallow-draft weights found)"


def render(rows, args, model, costs=None) -> str:
    lines = ["## Speculative decoding vs plain greedy and transformers", "",
             f"Command: `python -m bench speculative --repeats {args.repeats} --max-new-tokens "
             f"{args.max_new_tokens} --gamma {args.gamma} --draft-layers {args.draft_layers}"
             f"{model_options.flags(args)}`  ",
             f"Model: {model}; prompts: bench/prompts.py (chat template; pad id 0 for generate); "
             f"machine: {machine()}.  ",
             "Speed is tokens/s relative to our plain greedy on the same prompt in the same repeat "
             "(all contenders interleaved, order alternating). Temperature 0 throughout. "
             f"Draft model: {draft_note(args)}. Values: median [min–max] over prompts × repeats. {MEMORY_NOTE}", "",
             "| contender | speed vs our greedy | τ (tokens / target forward) | acceptance rate | peak MiB |",
             "|---|---|---|---|---|"]
    for name, r in rows.items():
        tau = spread(r["tau"]) if r["tau"] else "—"
        acc = f"{statistics.median(r['acc']):.3f}" if r["acc"] else "—"
        lines.append(f"| {name} | {spread(r['tps'])} | {tau} | {acc} | {mib_cell(r['peak'])} |")
    return "\n".join(lines + (render_break_even(*costs[:3]) if costs else []))


def render_break_even(rows, draft_ms: float, greedy_ms: float) -> list[str]:
    lines = ["", "What τ a draft needs on this machine, measured after the runs above (ms of a target "
                 "forward over n new tokens after a cached prefix, the median of three alternating profiles "
                 f"of 7 repeats each: 1 token {greedy_ms:.1f} ms; one draft-token "
                 f"forward {draft_ms:.1f} ms). A round costs verify(γ + 1) + γ × draft; greedy costs verify(1) "
                 "per token. Bookkeeping is left out, so the τ columns are lower bounds.", "",
             "| γ | verify(γ + 1) ms | round ms | τ for greedy's speed | τ for 1.2× greedy | τ at most |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['gamma']} | {r['verify_ms']:.1f} | {r['round_ms']:.1f} | {r['tau_parity']:.2f} | "
                     f"{r['tau_1_2']:.2f} | {r['tau_max']} |")
    return lines


def render_feature_break_even(verify_ms, feature_ms: float, gammas=(1, 2, 3, 4, 5, 6, 8)) -> str:
    """The same arithmetic for the feature drafter: its token (one MLP step and the sliced head) timed
    after the runs (median of 15)."""
    lines = ["", f"The same for the feature drafter (one drafted token {feature_ms:.1f} ms):", "",
             "| γ | round ms | τ for greedy's speed | τ for 1.2× greedy |", "|---|---|---|---|"]
    for r in break_even(verify_ms, feature_ms, gammas):
        lines.append(f"| {r['gamma']} | {r['round_ms']:.1f} | {r['tau_parity']:.2f} | {r['tau_1_2']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench speculative")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--draft-layers", type=int, default=4)
    model_options.add(parser)
    args = parser.parse_args(argv)
    lm = model_options.load_model(args)
    draft = load_shallow(lm) if DEFAULT_SHALLOW.is_file() else truncated_draft(
        lm, args.draft_layers, name=f"untrained early exit L={args.draft_layers}")
    draft.name = "shallow draft" if DEFAULT_SHALLOW.is_file() else draft.name
    warm = SpeculativeConfig(max_new_tokens=2, gamma=COST_MAX_GAMMA, draft="model", gamma_policy="cost")
    _ours(lm, lm.encode(PROMPTS["chat"]), warm, drafter=draft)      # profiles and caches the cost tables first
    feature = load_feature(lm) if DEFAULT_FEATURE.is_file() else None
    if feature is not None:
        FeatureDrafter(feature).token_ms(lm)                      # timed once, before the runs
    rows = measure(lm, draft, args, feature)
    costs = cost_rows(lm, draft)
    body = render(rows, args, model_options.label(lm), costs)
    if feature is not None:
        body += "\n" + render_feature_break_even(costs[3], FeatureDrafter(feature).token_ms(lm)[feature.name])
    model_options.write(args, "speculative", body)
    print(body)
