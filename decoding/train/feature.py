"""Train the feature drafter (decoding/drafters/feature_net.py) by distillation from the target, on this CPU.

Data: the cached self-distillation set the other drafters train on (decoding/train/parallel.py generate_distill):
row i of an answer holds its token x_i, the LM-head input h_i that produced it and the target's top-k
there. A training anchor t starts from the true (h_t, x_t) and unrolls `unroll` steps the way drafting
does: each step feeds the drafter's own predicted LM-head input back in, with the true token (under
greedy verification a draft position only counts when every token before it was the target's). Loss
per step k: cross-entropy to x_{t+k} + `soft_weight` × cross-entropy to the target's top-k at t+k +
`feature_weight` × smooth-L1 to h_{t+k}, weighted `decay`^(k−1).

Evaluation on held-out prompts: from every anchor the drafter drafts greedily (its own tokens and
features, as at run time) and counts the leading drafts equal to the target's answer; τ and per-position
acceptance follow the shallow draft's definitions (decoding.train.common.lead_metrics).

With `--heads N` the net attends over the context (decoding.drafters.feature_net); it trains on whole sequences,
prompt rows included (decoding.train.context_rows, decoding.train.attending), `--seqs` of them per step.

Entry point: `python -m decoding train feature [flags]`.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from decoding.core.errors import ConfigError, check, check_number
from decoding.drafters.feature_net import DEFAULT_FEATURE, FeatureNet, FeatureShape, save_feature
from decoding.train.common import (
    TrainedReport,
    Trainer,
    display_name,
    finish,
    lead_metrics,
    target_meta,
    tau_summary,
)
from decoding.train.data import DataSettings, DistillData, anchors, data_split, distill_set, sequence_ends, vocab_slice
from decoding.train.feature_loss import position_loss
from decoding.train.shallow import budget_note, changed_flags

GAMMAS = (1, 2, 3, 4, 5, 6, 8)


@dataclass(frozen=True)
class FeatureSettings(DataSettings):
    width: int = 768
    mlp: int = 1536
    blocks: int = 2
    unroll: int = 6              # drafting steps per training anchor
    steps: int = 2000
    batch_size: int = 256        # anchors per step
    lr: float = 1e-3
    soft_weight: float = 0.5
    feature_weight: float = 0.5
    decay: float = 0.8           # weight of step k: decay^(k−1)
    noise: float = 0.0           # uniform noise ±noise added to the anchor's true LM-head input (training only)
    weight_decay: float = 0.01
    heads: int = 0               # > 0: an attending drafter (one attention layer over the context's rows)
    head_dim: int = 64
    seqs: int = 4                # attending drafter: whole sequences per step (every anchor in them trains)
    init: str = ""               # start from this feature-drafter weights file (same shape but for attention;
                                 # a new attention layer starts with a zero output map: the init net's drafts)
    max_minutes: float = 29.0    # training stops early at this wall-clock budget
    device: str = "cpu"          # where the MLP drafter trains (cuda on a GPU); held-out metrics run on the CPU
    autocast: str = "none"       # bfloat16: matmuls in bfloat16 (weights and optimizer stay float32), ~4x
                                 # faster on a CPU with AMX or AVX512-BF16, slower on one without

    def __post_init__(self):
        super().__post_init__()
        for name in ("width", "mlp", "unroll", "steps", "batch_size", "head_dim", "seqs"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 1, name, v, "must be an integer >= 1")
        for name in ("blocks", "heads"):
            check(isinstance(getattr(self, name), int) and getattr(self, name) >= 0, name, getattr(self, name),
                  "must be an integer >= 0")
        for name in ("lr", "max_minutes", "decay"):
            check_number(name, getattr(self, name), 0, above=True)
        for name in ("soft_weight", "feature_weight", "noise", "weight_decay"):
            check_number(name, getattr(self, name), 0)
        check(not self.init or Path(self.init).is_file(), "init", self.init, "is not a file")
        check(self.device == "cpu" or (self.device.split(":")[0] == "cuda" and torch.cuda.is_available()),
              "device", self.device, "must be cpu, or cuda on a machine with a CUDA GPU")
        check(self.device == "cpu" or not self.heads, "device", self.device, "the attending drafter trains on the CPU")
        check(self.autocast in ("none", "bfloat16"), "autocast", self.autocast, "choose none or bfloat16")


@dataclass
class FeatureReport(TrainedReport):
    before: dict
    after: dict
    train_metrics: dict = field(default_factory=dict)   # on (up to 64) training sequences: shows over-fitting
    target: str = ""
    weights: str = ""
    size_bytes: int = 0
    machine: str = ""            # where it trained: the GPU's name, or the CPU's and its thread count


def step_loss(net: FeatureNet, data: DistillData, rows: torch.Tensor, slice_of: torch.Tensor,
              settings: FeatureSettings, gen: torch.Generator | None = None) -> torch.Tensor:
    """Unrolled training loss for the anchors `rows` (see the module docstring)."""
    end = sequence_ends(data, rows)
    feature, token = data.hidden[rows].float(), data.tokens[rows]
    if settings.noise > 0:
        feature = feature + ((torch.rand(feature.shape, generator=gen) * 2 - 1) * settings.noise).to(feature.device)
    total = feature.new_zeros(())
    for k in range(1, settings.unroll + 1):
        target = rows + k
        valid = target < end
        safe = torch.where(valid, target, rows)
        feature = net.step(feature, token)
        total = total + position_loss(net, feature, data, safe, valid, slice_of, settings) * settings.decay ** (k - 1)
        token = data.tokens[safe]
    return total


@torch.no_grad()
def leading_drafts(net: FeatureNet, data: DistillData, gamma: int,
                   chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per anchor: how many of γ greedy drafts (own tokens and features) equal the target's answer,
    whether the anchor's window of γ lies inside its answer, and whether the first draft was a hit.
    -> ((N,) long, (N,) bool, (N,) bool)."""
    rows = anchors(data)
    leads, fulls, firsts = [], [], []
    ids = net.vocab_ids.cpu()
    for i in range(0, len(rows), chunk):
        r = rows[i:i + chunk]
        end = sequence_ends(data, r)
        feature, token = data.hidden[r].float(), data.tokens[r]
        alive, lead = torch.ones(len(r), dtype=torch.bool), torch.zeros(len(r), dtype=torch.long)
        for k in range(1, gamma + 1):
            feature = net.step(feature, token)
            token = ids[net.slice_logits(feature).argmax(-1)]
            target = r + k
            hit = (target < end) & (token == data.tokens[torch.where(target < end, target, r)])
            if k == 1:
                firsts.append(hit.clone())
            alive &= hit
            lead += alive.long()
        leads.append(lead), fulls.append(r + gamma < end)
    return torch.cat(leads), torch.cat(fulls), torch.cat(firsts)


def evaluate(net: FeatureNet, data: DistillData, gammas: Sequence[int] = GAMMAS) -> dict:
    """Top-1 of the first draft over every anchor; τ and per-position acceptance over the anchors with
    a full window of max(gammas)."""
    net.eval()
    lead, full, first = leading_drafts(net.float(), data, max(gammas))
    return lead_metrics(lead[full], gammas, float(first.float().mean()) if len(first) else math.nan, int(len(first)))


class _Plain:
    """The MLP drafter's anchors, batches and metrics (the module docstring)."""

    def __init__(self, data: DistillData, train_ids, held_ids, settings: FeatureSettings):
        self.train, self.held, self.settings = data.subset(train_ids), data.subset(held_ids), settings
        self.fit = self.train.subset(list(range(min(64, len(train_ids)))))
        self.rows = anchors(self.train)
        check(len(self.rows) >= 1, "data", self.train.positions, "has no training anchors (answers too short)")
        self.on_device = self.train.to(settings.device)

    def loss(self, net, slice_of, gen):
        pick = self.rows[torch.randint(len(self.rows), (self.settings.batch_size,), generator=gen)]
        return step_loss(net, self.on_device, pick.to(self.settings.device), slice_of, self.settings, gen)

    def metrics(self, net, which: str) -> dict:
        net.cpu()
        try:
            return evaluate(net, self.held if which == "held" else self.fit)
        finally:
            net.to(self.settings.device)


class _Attending:
    """The attending drafter's sequence layouts over prompt rows + answers (decoding.train.attending)."""

    def __init__(self, lm, data: DistillData, prompts, train_ids, held_ids, settings: FeatureSettings, progress):
        from decoding.train.attending import layout, subset
        from decoding.train.context_rows import prompt_rows

        check(prompts is not None and len(prompts) == len(data.offsets) - 1, "prompts", None,
              "an attending drafter trains on the prompts' rows too: pass the prompts the data answers")
        rows, offsets = prompt_rows(lm, prompts, progress=progress)
        whole = layout(data, prompts, rows, offsets)
        self.data, self.settings = data, settings
        self.train, self.held = subset(whole, train_ids), subset(whole, held_ids)
        self.fit = subset(whole, train_ids[:64])
        self.n_train = len(train_ids)

    def loss(self, net, slice_of, gen):
        from decoding.train.attending import attending_loss, length_batches, seq_batch

        batch = seq_batch(self.train, length_batches(self.train, range(self.n_train), self.settings.seqs, gen))
        if self.settings.noise > 0:
            noise = (torch.rand(batch.features.shape, generator=gen) * 2 - 1) * self.settings.noise
            batch = dataclasses.replace(batch, features=batch.features + noise)
        return attending_loss(net, self.data, batch, slice_of, self.settings)

    def metrics(self, net, which: str) -> dict:
        from decoding.train.attending import attending_metrics

        return attending_metrics(net, self.data, self.held if which == "held" else self.fit, GAMMAS)


def feature_shape(settings: FeatureSettings, lm) -> FeatureShape:
    return FeatureShape(int(lm.model.config.hidden_size), settings.width, settings.mlp, settings.blocks,
                        settings.heads, settings.head_dim)


def check_init(settings: FeatureSettings, lm) -> None:
    """The --init file is a feature drafter whose shape fits these settings (checked before any data)."""
    from decoding.drafters.feature_net import read_meta

    if not settings.init:
        return
    try:
        theirs = read_meta(settings.init)["shape"]
    except ConfigError:
        raise ConfigError("init", settings.init, "is not a feature-drafter weights file") from None
    ours = asdict(feature_shape(settings, lm))
    keys = ("hidden_size", "width", "mlp", "blocks") + (("head_dim",) if ours["heads"] and theirs.get("heads") else ())
    differ = [k for k in keys if theirs.get(k) != ours[k]]
    check(not differ, "init", settings.init, f"does not fit this drafter's shape ({differ[0]} {theirs.get(differ[0])}, "
                                             f"not {ours[differ[0]]})" if differ else "")


def start_from(net: FeatureNet, path: str) -> None:
    """Load every trained tensor of the weights file at `path` into `net`; the attention layer, if the
    file has none, starts with a zero output map, so the net drafts exactly as the file's does."""
    from safetensors.torch import load_file

    from decoding.drafters.feature_net import read_meta

    check(Path(path).is_file(), "init", path, "is not a file")
    try:
        read_meta(path)
    except ConfigError:
        raise ConfigError("init", path, "is not a feature-drafter weights file") from None
    state = load_file(path)
    own = net.state_dict()
    for name, value in state.items():
        check(name in own and own[name].shape == value.shape, "init", path,
              f"does not fit this drafter's shape ({name}: {tuple(value.shape)})")
    missing = [k for k in own if k not in state and not k.startswith("attention.")]
    check(not missing, "init", path, f"lacks {missing[0]} (another shape)" if missing else "")
    net.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()}, strict=False)
    if net.attends and not any(k.startswith("attention.") for k in state):
        torch.nn.init.zeros_(net.attention.o.weight), torch.nn.init.zeros_(net.attention.o.bias)


def train_feature_net(lm, data: DistillData, settings: FeatureSettings, progress: bool = True, prompts=None):
    """-> (net on the CPU, FeatureReport). Trains in float32 on settings.device; an attending drafter
    (settings.heads > 0) also needs the `prompts` the data answers."""
    from tqdm import tqdm

    train_ids, held_ids = data_split(data, settings.heldout_every)
    held_ids = held_ids or train_ids[:8]
    ids_slice = vocab_slice(data.subset(train_ids), lm, "seen")
    torch.manual_seed(settings.seed)
    net = FeatureNet(feature_shape(settings, lm), ids_slice)
    if settings.init:
        start_from(net, settings.init)
    net = net.attach(lm).float()
    net.embed, net.head = net.embed.float().cpu(), net.head.float().cpu()
    net.cpu()
    slice_of = torch.full((lm.vocab_size,), -1, dtype=torch.long)
    slice_of[torch.tensor(ids_slice)] = torch.arange(len(ids_slice))
    task = (_Attending(lm, data, prompts, train_ids, held_ids, settings, progress) if settings.heads
            else _Plain(data, train_ids, held_ids, settings))
    before = task.metrics(net, "held")
    net.to(settings.device)
    slice_of = slice_of.to(settings.device)
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    sched = one_cycle(opt, settings.lr, settings.steps)
    gen = torch.Generator().manual_seed(settings.seed)
    start, loss_avg, done = time.perf_counter(), None, 0
    net.train()
    bar = tqdm(range(settings.steps), desc="train feature", unit="step", disable=not progress)
    for _ in bar:
        with torch.autocast(torch.device(settings.device).type, torch.bfloat16, enabled=settings.autocast != "none"):
            loss = task.loss(net, slice_of, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        done += 1
        value = float(loss.detach())
        loss_avg = value if loss_avg is None else 0.98 * loss_avg + 0.02 * value
        bar.set_postfix(loss=f"{loss_avg:.3f}")
        if time.perf_counter() - start > 60 * settings.max_minutes:
            break
    seconds = round(time.perf_counter() - start, 1)
    after, fit = task.metrics(net, "held"), task.metrics(net, "fit")
    report = FeatureReport(settings=asdict(settings), data=dict(data.info),
                           shape={**asdict(net.shape), "vocab_slice": len(ids_slice)},
                           params=sum(p.numel() for p in params), steps=done, seconds=seconds,
                           final_loss=round(loss_avg if loss_avg is not None else math.nan, 4),
                           before=before, after=after, train_metrics=fit)
    report.data.update(train_sequences=len(train_ids), heldout_sequences=len(held_ids))
    report.machine = training_machine(settings.device)
    return net.cpu(), report


def one_cycle(opt, lr: float, steps: int):
    """One-cycle learning rate: 5 % warm-up (at least 2 steps), then annealing; a constant rate below 4
    steps (the schedule needs a step in each phase: 0.05 × 20 steps = 1 divided by zero)."""
    if steps < 4:
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=max(0.05, 2 / steps))


def training_machine(device: str) -> str:
    from decoding.runtime.packed_gemm import cpu_name

    if device != "cpu":
        return f"{torch.cuda.get_device_name(torch.device(device))} (CUDA)"
    return f"{cpu_name()}, {torch.get_num_threads()} threads"


def model_card(report: FeatureReport, title: str) -> str:
    """Markdown from the report only: data, run, held-out acceptance before/after training."""
    d, s, a, b, sh = report.data, report.settings, report.after, report.before, report.shape
    gammas = list(a["tau_chain"])
    row = lambda name, m: f"| {name} | " + " | ".join(f"{m['tau_chain'][g]:.2f}" for g in gammas) + " |"
    return "\n".join([
        f"# {title}", "",
        "Feature drafter for DecodeScope's `speculative` strategy (`--draft feature`): from the target's LM-head input "
        "h_t that produced the last token x_t (taken from the verification forward the target runs anyway), "
        + (f"one causal attention layer ({sh['heads']} heads of {sh['head_dim']}, no positional encoding) over the "
           "pairs (h_j, x_{j+1}) of the whole context, prompt included, then " if sh.get("heads") else "")
        + f"{sh['blocks']} gated MLP block(s) of width {sh['width']} (hidden {sh['mlp']}) predict the next LM-head "
        "input, and "
        f"the target's own head over a {sh['vocab_slice']}-token slice (trained scale and bias) drafts the next token; "
        "the draft's own prediction feeds the next step. Generated by "
        f"`python -m decoding train feature{changed_flags(s, FeatureSettings)}` from the run below.", "",
        "## Data", "",
        f"- target `{report.target}`; its {'greedy' if not d.get('temperature') else 'sampled'} answers (up to "
        f"{d.get('answer_tokens')} tokens) to {d.get('prompts')} prompts, {d.get('positions')} positions, "
        f"top-{d.get('soft_k')} soft labels (the cached set every trainer given the same data flags reads)",
        *([f"- prompts: {d['source']}"] if d.get("source") else []),
        f"- {d.get('train_sequences')} sequences for training, {d.get('heldout_sequences')} held out "
        f"(one prompt in {s['heldout_every']} of each part; in the templated part one base prompt in "
        f"{s['heldout_every']}, with all its variants)", "",
        "## Training", "",
        f"- {report.params:,} trained parameters; file {report.size_bytes / 1e6:.1f} MB (float16)",
        (f"- {report.steps} steps of {s['seqs']} whole sequences (every anchor in them), each anchor unrolled "
         f"{s['unroll']} drafting steps{budget_note(report)}; " if sh.get("heads") else
         f"- {report.steps} steps of {s['batch_size']} anchors, each unrolled {s['unroll']} drafting "
         f"steps{budget_note(report)}; ")
        +
        f"AdamW lr {s['lr']} one-cycle, weight decay {s['weight_decay']}, input noise ±{s['noise']}; loss per step = "
        f"CE + {s['soft_weight']}·soft CE + {s['feature_weight']}·smooth-L1 "
        f"to the next LM-head input, step k weighted {s['decay']}^(k−1); {report.seconds} s on "
        f"{report.machine or 'the training machine'}; "
        f"final loss {report.final_loss}", "",
        f"## Held-out results ({a['positions']} anchors; greedy drafting from each, own tokens and features)", "",
        f"- first draft equals the target's token: {b['top1']:.3f} untrained → {a['top1']:.3f} trained "
        f"({report.train_metrics.get('top1', math.nan):.3f} on training sequences)",
        *(["- a held-out follow-up conversation continues a training prompt and its answer, which the drafter "
           "was trained on; `python -m decoding train eval-feature` gives held-out acceptance per kind of part"]
          if s.get("n_follow_up") else []), "",
        "| γ | " + " | ".join(str(g) for g in gammas) + " |", "|---|" + "---:|" * len(gammas),
        row("τ untrained", b), row("τ trained", a), row("τ trained, training sequences", report.train_metrics), "",
        f"Per-position acceptance (accepted at k / rounds that drafted k, γ = {max(gammas)}):", "",
        "| k | " + " | ".join(str(p["position"]) for p in a["per_position"]) + " |",
        "|---|" + "---:|" * len(a["per_position"]),
        "| trained | " + " | ".join(f"{p['accept_given_prefix']:.2f}" for p in a["per_position"]) + " |", ""])


def train_feature(lm, settings: FeatureSettings, out: str | Path, *, prompts=None, progress: bool = True,
                  title: str | None = None) -> FeatureReport:
    """Prompts -> cached distillation data -> training -> weights at `out` and the model card (.md)."""
    check_init(settings, lm)                   # before the data (maybe an hour)
    prompts, data, source = distill_set(lm, settings, progress, prompts)
    net, report = train_feature_net(lm, data, settings, progress=progress, prompts=prompts)
    report.target, report.data["source"] = display_name(lm), source
    out = Path(out)
    save_feature(net, out, meta={"target": lm.name, **target_meta(lm), "after": report.after, "before": report.before,
                                 "data": report.data, "steps": report.steps})
    return finish(report, out, lambda r: model_card(r, title or f"Feature drafter for {display_name(lm)}"))


TRAINER = Trainer("python -m decoding train feature", "train the feature drafter for speculative decoding by "
                  "distillation", FeatureSettings, DEFAULT_FEATURE, "feature", train_feature,
                  lambda r: f"first draft {r.before['top1']:.3f} -> {r.after['top1']:.3f}; "
                            f"{tau_summary(r.after['tau_chain'])}")
build_parser, main_train_feature = TRAINER.parser, TRAINER.main
