"""Command line: python -m decoding {run,compare,serve,train} ... (see docs/cli.md for the flag table).

Bad input prints one line naming the parameter and the bad value, and exits with status 2; a run that
stops mid-way (NaN logits, out of memory) prints its text so far, writes its trace, and exits with 2 too.
Ctrl-C stops a run the same way, with a one-line note and status 130. `--out` is checked before the model
loads and written atomically: a failed write leaves the file that was there unchanged."""
from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from pathlib import Path

from decoding.core import trace as trace_mod
from decoding.core.config import GAMMA_POLICIES, BaseConfig
from decoding.core.errors import ConfigError, check
from decoding.runner import STRATEGIES, RunInterrupted, run, run_lockstep
from decoding.runtime.files import CacheWarning, check_writable, write_text_atomic
from decoding.runtime.model_spec import DEVICE_MAPS, DEVICES, DTYPES, ModelSpec
from decoding.runtime.models import load

INTERRUPTED = 130                      # exit status after Ctrl-C (128 + SIGINT), as shells report it


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        self.exit(2, f"error: {message}\n")


def _common(p: argparse.ArgumentParser, prompt: bool = True) -> None:
    """The model and strategy flags; with `prompt`, the prompt's too (serve takes its prompts from requests)."""
    p.add_argument("--model", default="default", help="'default' (embedded SmolLM2-135M), an HF id or a path")
    p.add_argument("--gguf-file", default=None, help="GGUF file inside --model")
    p.add_argument("--device", default="auto", choices=DEVICES)
    p.add_argument("--dtype", default="auto", choices=list(DTYPES))
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--device-map", choices=DEVICE_MAPS, help="place a model too large for one device "
                   "with accelerate (GPUs, then CPU, then disk); leave --device at auto")
    p.add_argument("--max-memory", help="with --device-map: per-device budget, e.g. '0=20GiB,cpu=64GiB'")
    p.add_argument("--offload-folder", help="with --device-map: directory for weights offloaded to disk")
    p.add_argument("--no-pack-gemm", action="store_true", help="CPU: keep MKL's plain sgemm for every "
                   "forward (default: the GEMM kernel per row count profiled once for this machine and model)")
    p.add_argument("--fast-path", action="store_true", help="CUDA: decode on static KV caches and replay each "
                   "short forward as a CUDA graph (one launch per step instead of hundreds)")
    if prompt:
        p.add_argument("--prompt", required=True)
        p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top-n", type=int, default=10, help="candidates recorded per step")
    # Strategy parameters default to None: each strategy's own config default applies.
    p.add_argument("--temperature", type=float, help="sampling temperature (sample: 1.0; dspark: 0 = greedy)")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--min-p", type=float)
    p.add_argument("--num-beams", type=int)
    p.add_argument("--length-penalty", type=float)
    p.add_argument("--early-stopping", action="store_true", default=None)
    p.add_argument("--gamma", type=int, help="draft length (speculative: 1..32; dspark: 1..16)")
    p.add_argument("--draft", help="speculative: 'auto' (default: lookup+feature where the shipped feature "
                                   "drafter was trained for the model, else lookup+recycling), 'lookup' (prompt "
                                   "lookup), 'recycling' (token recycling, any model), 'shallow' (trained "
                                   "self-draft; 'shallow:FILE' for other weights), 'feature' (trained feature "
                                   "drafter over the target's LM-head input; 'feature:FILE'), a draft model "
                                   "('model:ID', or the id/path alone), or 'lookup+' one of those (prompt lookup "
                                   "where it matches, else that drafter); docs/drafters.md 'Drafter names'")
    p.add_argument("--gamma-policy", choices=list(GAMMA_POLICIES),
                   help="speculative γ policy (cost: per round the γ with the most expected tokens per ms)")
    p.add_argument("--confidence-threshold", type=float, help="speculative confidence policy: stop below this q_draft")
    p.add_argument("--gamma-max", type=int, help="speculative: draft and record up to this many (what-if)")
    p.add_argument("--lookup-max-ngram", type=int, help="prompt lookup: longest n-gram matched")
    p.add_argument("--top-k-candidates", type=int, help="dspark: candidates per drafted position")
    p.add_argument("--select", choices=["chain", "tree"], help="dspark: verify a chain or a tree")
    p.add_argument("--budget", type=int, help="dspark tree: nodes verified")
    p.add_argument("--cost-table", help="verify-cost JSON file, or 'auto' (profiled once); dspark: adaptive size; "
                                        "speculative: the cost policy's table (default auto)")
    p.add_argument("--lossy-threshold", type=float, help="dspark: LOSSY acceptance above this p_target")
    p.add_argument("--drafter", help="dspark: 'auto' (default: the shipped feature drafter where it was trained "
                                     "for the model, token recycling on any other), 'feature', 'parallel', "
                                     "'feature:FILE', 'parallel:FILE' (or a parallel drafter's weights file), "
                                     "'recycling', 'suffix', 'model:ID' (tree sources for any model); join with "
                                     "'+' after a trained one, e.g. 'feature+recycling'; docs/drafters.md "
                                     "'Drafter names'")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m decoding", description="DecodeScope decoding engine")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run_p = sub.add_parser("run", help="decode one prompt with one strategy")
    _common(run_p)
    run_p.add_argument("--strategy", default="greedy", choices=sorted(STRATEGIES))
    run_p.add_argument("--out", default=None, help="write the trace JSON here")
    cmp_p = sub.add_parser("compare", help="several strategies on the same prompt and seed")
    _common(cmp_p)
    cmp_p.add_argument("--strategy", action="append", required=True, choices=sorted(STRATEGIES))
    cmp_p.add_argument("--out", default=None, help="write the traces as a JSON list here")
    serve_p = sub.add_parser("serve", help="an OpenAI-compatible HTTP endpoint (docs/serve.md)")
    _common(serve_p, prompt=False)
    serve_p.add_argument("--strategy", default="greedy", choices=sorted(STRATEGIES))
    from decoding.serve.flags import add_serve_flags

    add_serve_flags(serve_p)
    return parser


def _fields(strategy: str) -> set[str]:
    return {f.name for f in dataclasses.fields(STRATEGIES[strategy].config_cls)}


def make_config(strategy: str, args: argparse.Namespace):
    """The frozen config of `strategy`, filled from the CLI flags it knows."""
    names = _fields(strategy)
    return STRATEGIES[strategy].config_cls(**{k: v for k, v in vars(args).items() if k in names and v is not None})


def check_applicable(strategies: list[str], args: argparse.Namespace) -> None:
    """Refuse a strategy flag the user gave that none of `strategies` takes (strategy flags default to
    None, so a flag left out never counts)."""
    common = {f.name for f in dataclasses.fields(BaseConfig)}
    chosen = list(dict.fromkeys(strategies))
    for name in sorted(set().union(*map(_fields, STRATEGIES)) - common):
        value = getattr(args, name, None)
        takers = [s for s in STRATEGIES if name in _fields(s)]
        if value is not None and not set(takers) & set(chosen):
            which = "strategy" if len(chosen) == 1 else "strategies"
            raise ConfigError(name, value, f"does not apply to {which} {', '.join(map(repr, chosen))} "
                                           f"(only to {', '.join(takers)})")


def _summary(tr) -> str:
    s = tr.stats
    line = (f"[{tr.strategy}] {s.new_tokens} tokens, {s.target_forwards} target forwards, "
            f"{s.wall_s:.2f} s, {s.tokens_per_s:.1f} tok/s, stop: {tr.stop_reason}")
    if s.mean_accepted_length is not None:
        line += f", tau {s.mean_accepted_length:.2f}"
    if s.acceptance_rate is not None:             # None when no round drafted a token (lookup found no match)
        line += f", acceptance {s.acceptance_rate:.2f}"
    drafting = getattr(tr.steps[0], "drafting", None) if tr.steps else None
    if drafting is not None:                      # speculative and DSpark: which sources ran, and why
        line += f", sources {'+'.join(drafting.sources) or 'none'} ({drafting.reason})"
        if drafting.memory:                       # recycling / suffix: what their memory held at the start
            line += f", memory: {drafting.memory}"
    return line


def _strategy_kwargs(config, args, lm) -> dict:
    """Extra inputs a strategy needs: the loaded draft model of speculative decoding."""
    draft = getattr(config, "draft_model", None)
    if config.strategy != "speculative" or draft is None:
        return {}
    from decoding.drafters.factory import load_draft

    return {"drafter": load_draft(draft, lm, device=args.device, dtype=args.dtype,
                                   trust_remote_code=args.trust_remote_code, pack_gemm=not args.no_pack_gemm,
                                   fast_path=args.fast_path)}


def model_spec(args) -> ModelSpec:
    return ModelSpec(args.model, args.gguf_file, args.device, args.dtype, args.trust_remote_code,
                     device_map=args.device_map, max_memory=args.max_memory, offload_folder=args.offload_folder,
                     pack_gemm=not args.no_pack_gemm, fast_path=args.fast_path)


def _prepare(args):
    check(args.prompt.strip() != "", "prompt", args.prompt, "must not be empty")
    lm = load(model_spec(args))
    ids = lm.encode(args.prompt, chat_template=not args.no_chat_template)
    return lm, ids


def _out_path(args) -> Path | None:
    """--out, checked writable before any work (None when not given)."""
    return None if args.out is None else check_writable(args.out, "out")


def _write(out: Path | None, text: str) -> None:
    """`text` into --out atomically; a failed write (a full disk) is one line and leaves the old file."""
    if out is None:
        return
    try:
        write_text_atomic(out, text)
    except OSError as err:
        raise ConfigError("out", str(out), f"could not be written ({err.strerror or err}); "
                                           "a file already there is unchanged") from None


def _collect(call) -> tuple:
    """(call()'s result, False), or after Ctrl-C during the run (the result so far, True)."""
    try:
        return call(), False
    except RunInterrupted as stop:
        return stop.result, True


def _finish(traces: list, interrupted: bool, out: Path | None, labelled: bool) -> int:
    """Print the error line of each run that failed mid-way and, after Ctrl-C, a one-line note; the
    exit status: 130 after Ctrl-C, 2 after an error, else 0."""
    failed = [t for t in traces if t.error]
    for tr in failed:
        print(f"error: {f'[{tr.strategy}] ' if labelled else ''}{tr.error}", file=sys.stderr)
    if interrupted:
        kept = "the runs so far are above" if labelled else f"the text so far ({len(traces[0].steps)} steps) is above"
        where = f", the trace in {out}" if out is not None else ""
        print(f"interrupted: stopped by Ctrl-C; {kept}{where}", file=sys.stderr)
        return INTERRUPTED
    return 2 if failed else 0


def cmd_run(args) -> int:
    check_applicable([args.strategy], args)
    config = make_config(args.strategy, args)
    out = _out_path(args)
    lm, ids = _prepare(args)
    kwargs = _strategy_kwargs(config, args, lm)
    tr, interrupted = _collect(lambda: run(lm, ids, config, prompt_text=args.prompt, **kwargs))
    if tr.error and not tr.steps:      # refused before the first step: bad input
        raise ConfigError.from_line(tr.error)
    print(tr.text)
    print(_summary(tr))
    _write(out, trace_mod.to_json(tr))
    return _finish([tr], interrupted, out, labelled=False)


def cmd_compare(args) -> int:
    check_applicable(args.strategy, args)
    configs = [make_config(s, args) for s in args.strategy]
    out = _out_path(args)
    lm, ids = _prepare(args)
    lanes = {f"{i}: {c.strategy}": (c, _strategy_kwargs(c, args, lm)) for i, c in enumerate(configs)}
    result, interrupted = _collect(lambda: run_lockstep(lm, ids, lanes, prompt_text=args.prompt))
    traces = list(result.values())
    refused = [t for t in traces if t.error and not t.steps]
    if refused:                        # refused before the first step: bad input, one line
        raise ConfigError.from_line(refused[0].error)
    print(f"{'strategy':<12} {'tokens':>6} {'fwd':>5} {'tok/s':>7} {'tau':>5}  text")
    for tr in traces:
        tau = tr.stats.mean_accepted_length
        text = tr.text.replace("\n", " ")[:60]
        print(f"{tr.strategy:<12} {tr.stats.new_tokens:>6} {tr.stats.target_forwards:>5} "
              f"{tr.stats.tokens_per_s:>7.1f} {tau if tau is not None else '-':>5}  {text}")
    _write(out, "[" + ",".join(trace_mod.to_json(t) for t in traces) + "]")
    return _finish(traces, interrupted, out, labelled=True)


def cmd_serve(args) -> int:
    """Check the strategy and its settings as `run` does, then serve (decoding/serve)."""
    check_applicable([args.strategy], args)
    make_config(args.strategy, args)
    from decoding.serve.cli import Rules, serve

    rules = Rules(flags=_flags("serve"), make_config=make_config, check_applicable=check_applicable,
                  strategy_kwargs=_strategy_kwargs)
    return serve(args, rules, model_spec(args))


def _flags(command: str) -> dict[str, argparse.Action]:
    """The flags of `command` by their names (dest)."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices[command]._actions}


COMMANDS = {"run": cmd_run, "compare": cmd_compare, "serve": cmd_serve}


def _show_warning(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning):
    """A CacheWarning as one line, "warning: ..."; any other warning as Python shows it."""
    if issubclass(category, CacheWarning):
        print(f"warning: {message}", file=sys.stderr)
    else:
        _default(message, category, filename, lineno, file, line)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    warnings.showwarning = _show_warning
    try:
        if argv[:1] == ["train"]:      # python -m decoding train parallel [flags] (decoding/train/parallel.py)
            from decoding.train.cli import main_cli

            return main_cli(argv[1:])
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:          # before a run began (loading) or after it ended (writing)
        print("interrupted: stopped by Ctrl-C", file=sys.stderr)
        return INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
