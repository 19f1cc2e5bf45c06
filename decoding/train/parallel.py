"""Train the parallel drafter by self-distillation (CPU-feasible), with a progress bar.

1. Data (shared with other drafters): the target's own answers (greedy, or sampled) to varied prompts,
   generated in left-padded batches, then one teacher-forced forward per batch for the LM-head inputs
   (hidden states) and the target's top-k soft labels at every answer position. Cached on disk under
   <cache>/distill/<key>.pt, the key made of the model, the prompts and the settings. A drafter that
   reads feature layers (`--feature-layers 7,15,23`) gets those decoder layers' outputs at the same
   positions from one more teacher-forced forward over the cached answers (cached on its own).
2. Loss at every draft position k (teacher forcing: the true token at k−1 is the parent): cross-entropy
   to the target's token + soft-label cross-entropy to its top-k + BCE of the confidence toward
   "the drafter's top-1 is the target's token" (what temperature-0 acceptance accepts).
3. Per-position Platt calibration of the confidence on held-out prompts, on the anchors whose
   positions 1..k−1 were all hits (c_k estimates P(k accepted | all before accepted)).
4. Weights (float16 safetensors) and a model card generated from the run.

Entry point: `python -m decoding train parallel [flags]` or `train_parallel(lm, TrainSettings(...))`.
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from decoding.core.errors import check, check_number
from decoding.drafters.parallel import DrafterShape, DraftOut, ParallelDrafter
from decoding.runtime.hooks import check_feature_layers, decoder_layers
from decoding.runtime.paths import PARALLEL_WEIGHTS
from decoding.train.common import (
    TrainedReport,
    Trainer,
    display_name,
    ece,
    finish,
    lead_metrics,
    target_meta,
    tau_summary,
)
from decoding.train.data import (
    Batch,
    DataSettings,
    DistillData,
    anchors,
    data_split,
    distill_set,
    drafter_data,
    history_rows,
    make_batch,
    sequence_ends,
    training_chunks,
    vocab_slice,
)


def encode_rows(drafter: ParallelDrafter, data: DistillData, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The drafter's backbone over data rows (B, T) -> (B, T, D)."""
    return drafter.encode(data.hidden[rows].float(), data.tokens[rows], valid)


def draft_at(drafter: ParallelDrafter, data: DistillData, rows: torch.Tensor, parents: torch.Tensor | None = None):
    """The drafter's output at anchor rows (B,), each with its history window; `parents` (B, γ) the
    true tokens before each position (make_batch's), which a parent_mlp drafter reads."""
    window, valid = history_rows(data, rows, drafter.span)
    return drafter.draft_positions(encode_rows(drafter, data, window, valid)[:, -1], data.hidden[rows].float(),
                                   parents=parents)


# ------------------------------------------------------------------------------ loss
@dataclass(frozen=True)
class TrainSettings(DataSettings):
    gamma_max: int = 16
    rank: int = 64
    trunk: int = 512
    width: int = 256
    feature_layers: str = ""     # comma-separated target decoder layers whose outputs the trunk reads too
    layers: int = 0              # backbone blocks over the history window (decoding.drafters.parallel)
    window: int = 1              # rows each block sees, the anchor's included
    chunk: int = 1               # anchors per run of consecutive rows (batch_size / chunk runs a step; > 1 shares
                                 # the backbone pass over a run, 1 draws every anchor on its own)
    steps: int = 1500
    batch_size: int = 256
    lr: float = 2e-3
    soft_weight: float = 0.5
    conf_weight: float = 0.2
    feature_weight: float = 0.0  # × smooth-L1 of each position's z_k to the LM-head input that produced its label
    dropout: float = 0.0         # on the trunk and per-position activations, training only
    parent_mlp: bool = False     # the true token at k−1 enters position k's block too (decoding.drafters.parallel)
    weight_decay: float = 0.01
    vocab: str = "seen"          # seen (tokens of the answers) | full
    max_minutes: float = 0.0     # > 0: training stops early at this wall-clock budget (0: all `steps`)

    def __post_init__(self):
        super().__post_init__()
        for name in ("steps", "batch_size", "chunk", "window", "gamma_max", "rank", "trunk", "width"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 1, name, v, "must be an integer >= 1")
        check_number("lr", self.lr, 0, above=True)
        for name in ("soft_weight", "conf_weight"):
            check_number(name, getattr(self, name), 0)
        check(isinstance(self.layers, int) and self.layers >= 0, "layers", self.layers, "must be an integer >= 0")
        text = self.feature_layers
        check(isinstance(text, str) and (not text.strip() or all(x.strip().isdigit() for x in text.split(","))),
              "feature_layers", text, "must be comma-separated layer indices, e.g. 7,15,23")
        check(self.vocab in ("seen", "full"), "vocab", self.vocab, "choose seen or full")
        check_number("dropout", self.dropout, 0, below=1)
        check(isinstance(self.parent_mlp, bool), "parent_mlp", self.parent_mlp, "must be true or false")
        for name in ("weight_decay", "feature_weight"):
            check_number(name, getattr(self, name), 0)
        check(isinstance(self.max_minutes, float) and 0.0 <= self.max_minutes < math.inf, "max_minutes",
              self.max_minutes, "must be a finite number >= 0 (0: no limit)")

    @property
    def feature_layer_ids(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.feature_layers.split(",")) if self.feature_layers.strip() else ()

    def drafter_shape(self, lm) -> DrafterShape:
        """The drafter these settings make for `lm` (its checks run before any data is made)."""
        check_feature_layers(self.feature_layer_ids, len(decoder_layers(lm)))
        return DrafterShape(int(lm.model.config.hidden_size), lm.vocab_size, self.gamma_max, self.rank, self.trunk,
                            self.width, self.layers, self.window, feature_layers=self.feature_layer_ids,
                            parent_mlp=self.parent_mlp)


def losses(drafter: ParallelDrafter, out: DraftOut, batch: Batch, settings: TrainSettings):
    """out: the drafter's output at the batch's anchors. -> (total, token CE, confidence BCE, hits (B, γ)
    bool, exists (B, γ) bool)."""
    logits = drafter.teacher_logits(out, batch.parents)                     # (B, γ, V_s)
    logq = torch.log_softmax(logits.float(), -1)                             # (B, γ, V_s)
    valid = batch.labels >= 0                                                # (B, γ)
    ce = F.nll_loss(logq.flatten(0, 1), batch.labels.flatten().clamp(min=0), reduction="none").view_as(valid)
    ce = (ce * valid).sum() / valid.sum().clamp(min=1)
    soft_mask = batch.soft_ids >= 0                                           # (B, γ, k)
    soft_logq = logq.gather(-1, batch.soft_ids.clamp(min=0))                 # (B, γ, k)
    soft_p = batch.soft_probs * soft_mask
    soft = -(soft_p * soft_logq).sum() / soft_p.sum().clamp(min=1e-6)
    hits = (logq.argmax(-1) == batch.labels) & valid                         # (B, γ)
    exists = batch.labels != -2                                              # (B, γ) outside the slice: a miss
    g = logits.shape[1]
    conf = drafter.confidence_logit(torch.arange(g)[None, :], out.z[:, :g], logits.detach())  # (B, γ)
    bce = F.binary_cross_entropy_with_logits(conf, hits.float(), reduction="none")
    bce = (bce * exists).sum() / exists.sum().clamp(min=1)
    total = ce + settings.soft_weight * soft + settings.conf_weight * bce
    if settings.feature_weight:
        total = total + settings.feature_weight * feature_loss(out.z[:, :g], batch.future[:, :g], batch.labels[:, :g])
    return total, ce, bce, hits, exists


def feature_loss(z: torch.Tensor, future: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean smooth-L1 of the drafted hidden states z (B, γ, H) to the LM-head inputs that produced the
    target's tokens there, future (B, γ, H), over the positions inside their sequence (labels != −2)."""
    inside = labels != -2                                                   # (B, γ)
    per = F.smooth_l1_loss(z.float(), future, reduction="none").mean(-1)    # (B, γ)
    return (per * inside).sum() / inside.sum().clamp(min=1)


# ------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def evaluate(drafter: ParallelDrafter, data: DistillData, gamma: int, slice_of: torch.Tensor,
             max_rows: int = 20000) -> dict:
    """Teacher-forced top-1 hits and raw confidence logits on held-out anchors."""
    rows = anchors(data)[:max_rows]
    hits, conf, valid = [], [], []
    for chunk in rows.split(256):
        batch = make_batch(data, chunk, gamma, slice_of)
        out = draft_at(drafter, data, chunk, batch.parents)
        logits = drafter.teacher_logits(out, batch.parents)
        hits.append((logits.argmax(-1) == batch.labels) & (batch.labels >= 0))
        conf.append(drafter.confidence_logit(torch.arange(gamma)[None, :], out.z, logits))
        valid.append(_window(data, chunk, gamma))
    return {"hits": torch.cat(hits), "conf": torch.cat(conf), "valid": torch.cat(valid)}


def slice_index(drafter: ParallelDrafter) -> torch.Tensor:
    """(V,) each vocabulary id's index in the drafter's slice, −1 outside it."""
    slice_of = torch.full((drafter.shape.vocab_size,), -1, dtype=torch.long)
    slice_of[drafter.vocab_ids] = torch.arange(len(drafter.vocab_ids))
    return slice_of


def leading_hits(drafter: ParallelDrafter, data: DistillData, gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per anchor: how many drafted tokens a greedy chain of γ would have accepted there (teacher forced,
    as `evaluate`), and whether its whole window lies inside the answer. -> ((N,) long, (N,) bool)."""
    ev = evaluate(drafter, data, drafter.shape.gamma_max, slice_index(drafter), max_rows=data.positions)
    hits = ev["hits"][:, :gamma].int()
    return torch.cumprod(hits, 1).sum(1), ev["valid"][:, :gamma].all(1)


def chain_rounds(drafter: ParallelDrafter, data: DistillData, gamma: int) -> list[tuple[int, int]]:
    """The rounds a greedy chain decode (γ, one candidate per position) makes over one answer, predicted
    offline: [(anchor, accepted drafted tokens)], the first anchor the answer's first token (emitted by
    the prefill), each next one past the accepted tokens and the round's own target token."""
    check(len(data.offsets) == 2, "data", len(data.offsets) - 1, "must hold exactly one answer")
    lead = leading_hits(drafter, data, gamma)[0].tolist()
    rounds, anchor = [], 0
    while anchor < len(lead):
        rounds.append((anchor, lead[anchor]))
        anchor += lead[anchor] + 1
    return rounds


def _window(data: DistillData, rows: torch.Tensor, gamma: int) -> torch.Tensor:
    seq_end = sequence_ends(data, rows)
    return rows[:, None] + torch.arange(1, gamma + 1) < seq_end[:, None]     # (B, γ)


def conditioned(ev: dict) -> torch.Tensor:
    """(B, γ) mask: position k exists and positions 1..k−1 were all hits (all before accepted)."""
    before = torch.cumprod(torch.cat([torch.ones_like(ev["hits"][:, :1]), ev["hits"][:, :-1]], 1).int(), 1).bool()
    return before & ev["valid"]


def fit_platt(drafter: ParallelDrafter, ev: dict) -> None:
    """Per position: c = σ(a·logit + b) minimizing BCE on the conditioned held-out anchors."""
    mask = conditioned(ev)
    for k in range(ev["hits"].shape[1]):
        x, y = ev["conf"][mask[:, k], k].float(), ev["hits"][mask[:, k], k].float()
        if len(x) < 20 or y.min() == y.max():
            continue
        a, b = torch.ones(1, requires_grad=True), torch.zeros(1, requires_grad=True)
        opt = torch.optim.LBFGS([a, b], lr=0.5, max_iter=100)

        def closure(opt=opt, a=a, b=b, x=x, y=y):
            opt.zero_grad()
            loss = F.binary_cross_entropy_with_logits(a * x + b, y)
            loss.backward()
            return loss

        with torch.enable_grad():
            opt.step(closure)
        drafter.platt_a[k], drafter.platt_b[k] = float(a.detach()), float(b.detach())


def report_metrics(drafter: ParallelDrafter, ev: dict) -> dict:
    """Per-position top-1 accuracy (teacher forced), conditional acceptance and ECE before/after
    calibration, and the greedy chain's τ for each γ (leading hits + 1, full windows only)."""
    gamma = ev["hits"].shape[1]
    mask = conditioned(ev)
    per_pos = []
    for k in range(gamma):
        sel = mask[:, k]
        raw = torch.sigmoid(ev["conf"][sel, k])
        cal = drafter.calibrated(k, ev["conf"][sel, k])
        per_pos.append({"position": k + 1,
                        "top1": float(ev["hits"][ev["valid"][:, k], k].float().mean()),
                        "accept_given_prefix": float(ev["hits"][sel, k].float().mean()) if sel.any() else float("nan"),
                        "mean_confidence": float(cal.mean()) if sel.any() else float("nan"),
                        "ece_raw": ece(raw, ev["hits"][sel, k]), "ece_calibrated": ece(cal, ev["hits"][sel, k])})
    full = ev["valid"].all(1)
    leads = torch.cumprod(ev["hits"][full].int(), 1).sum(1)                  # (B',) leading hits of γ
    tau = lead_metrics(leads, range(1, gamma + 1), math.nan, int(full.sum()))["tau_chain"] if full.any() else {}
    return {"per_position": per_pos, "tau_chain": tau, "heldout_anchors": int(len(ev["hits"]))}


# ------------------------------------------------------------------------------ training
@dataclass
class TrainReport(TrainedReport):
    metrics: dict
    weights: str = ""
    size_bytes: int = 0


def train_drafter(lm, data: DistillData, settings: TrainSettings, progress: bool = True):
    """Train, calibrate and evaluate on held-out sequences. -> (drafter, TrainReport)."""
    from tqdm import tqdm

    train_seqs, held_seqs = data_split(data, settings.heldout_every)
    train, held = data.subset(train_seqs), data.subset(held_seqs)
    shape = settings.drafter_shape(lm)
    check(train.hidden.shape[1] == shape.row_width, "data", tuple(train.hidden.shape),
          f"rows must be {shape.row_width} wide for feature layers {list(shape.feature_layers)} (see drafter_data)")
    drafter = ParallelDrafter(shape, vocab_slice(train, lm, settings.vocab), seed=settings.seed).attach(lm)
    drafter.dropout = settings.dropout
    slice_of = slice_index(drafter)
    rows = anchors(train)
    check(len(rows) >= 1, "data", train.positions, "has no training anchors (answers too short)")
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=settings.lr, total_steps=settings.steps, pct_start=0.05)
    gen = torch.Generator().manual_seed(settings.seed)
    start, loss_avg = time.perf_counter(), None
    drafter.train()
    bar = tqdm(range(settings.steps), desc="train parallel", unit="step", disable=not progress)
    done = 0
    for _ in bar:
        if settings.max_minutes and time.perf_counter() - start > 60 * settings.max_minutes:
            break
        done += 1
        window, valid, is_anchor = training_chunks(train, rows, gen, max(1, settings.batch_size // settings.chunk),
                                                   min(settings.chunk, settings.batch_size), drafter.span)
        batch = make_batch(train, window[is_anchor], settings.gamma_max, slice_of,
                           shape.hidden_size if settings.feature_weight else 0)
        out = drafter.draft_positions(encode_rows(drafter, train, window, valid)[is_anchor], batch.hidden,
                                      parents=batch.parents)
        total, ce, bce, hits, _ = losses(drafter, out, batch, settings)
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        value = float(total.detach())
        loss_avg = value if loss_avg is None else 0.98 * loss_avg + 0.02 * value
        bar.set_postfix(loss=f"{loss_avg:.3f}", top1=f"{float(hits[:, 0].float().mean()):.2f}")
    drafter.eval()
    ev = evaluate(drafter, held if held.positions else train, settings.gamma_max, slice_of)
    fit_platt(drafter, ev)
    report = TrainReport(settings=asdict(settings), data=dict(data.info), shape=asdict(shape),
                         params=sum(p.numel() for p in params), steps=done,
                         seconds=round(time.perf_counter() - start, 1), final_loss=round(loss_avg or math.nan, 4),
                         metrics=report_metrics(drafter, ev))
    report.data.update(train_sequences=len(train_seqs), heldout_sequences=len(held_seqs),
                       train_positions=train.positions, heldout_positions=held.positions,
                       vocab_slice=len(drafter.vocab_ids))
    return drafter, report


def model_card(report: TrainReport, title: str) -> str:
    """Markdown describing the data, the run and the held-out results, from the report only."""
    d, s, m = report.data, report.settings, report.metrics
    layers, window = report.shape.get("layers", 0), report.shape.get("window", 1)
    reads = (f"the target's hidden states and tokens at the last {layers * (window - 1) + 1} emitted positions, "
             f"through {layers} attention block(s) of window {window},") if layers else \
        "the target's last hidden state and last token"
    feature_layers = report.shape.get("feature_layers") or []
    if feature_layers:
        reads += (f" and, at {'each of those positions' if layers else 'that position'}, the outputs of the "
                  f"target's decoder layers {', '.join(str(i) for i in feature_layers)} (0-based)")
    chunk = s.get("chunk", 1)
    per_step = f"{s['batch_size']}" if chunk == 1 else f"up to {s['batch_size']} anchors (runs of {chunk} consecutive)"
    lines = [f"# {title}", "",
             f"Parallel drafter for DecodeScope's `dspark` strategy (one pass over {reads}",
             f"gives γ positions; {_parent_words(report.shape)}; Platt-calibrated confidence).",
             "Generated by `python -m decoding train parallel` from the run below.", "",
             "## Data", "",
             f"- target: `{d.get('target_display', d.get('model'))}`; self-distillation, answers "
             f"{'greedy' if not d.get('temperature') else 'sampled at T=' + str(d.get('temperature'))}, "
             f"up to {d.get('answer_tokens')} tokens, top-{d.get('soft_k')} soft labels",
             f"- prompts: {d.get('prompts')} ({d.get('prompt_source', 'given as token ids')}); "
             f"{d.get('train_sequences')} for training, {d.get('heldout_sequences')} held out "
             f"(one in {s['heldout_every']})",
             f"- positions: {d.get('train_positions')} training, {d.get('heldout_positions')} held out; "
             f"vocabulary slice {d.get('vocab_slice')} tokens; generation took {d.get('seconds')} s", "",
             "## Model and training", "",
             f"- shape: {json.dumps(report.shape)}; {report.params:,} trainable parameters; "
             f"file {report.size_bytes / 1e6:.1f} MB (float16)",
             f"- {report.steps} steps of {per_step}, AdamW lr {s['lr']} one-cycle, weight decay "
             f"{s.get('weight_decay', 0.01)}, dropout {s.get('dropout', 0.0)}, loss = CE + {s['soft_weight']}·soft CE "
             f"+ {s['conf_weight']}·confidence BCE{_feature_term(s)}; {report.seconds} s; "
             f"final loss {report.final_loss}", "",
             f"## Held-out results ({m['heldout_anchors']} anchors)", "",
             "| position | top-1 | P(accept \\| prefix accepted) | mean confidence | ECE raw | ECE calibrated |",
             "|---:|---:|---:|---:|---:|---:|"]
    for p in m["per_position"]:
        lines.append(f"| {p['position']} | {p['top1']:.3f} | {p['accept_given_prefix']:.3f} "
                     f"| {p['mean_confidence']:.3f} "
                     f"| {p['ece_raw']:.3f} | {p['ece_calibrated']:.3f} |")
    lines += ["", "Greedy chain, mean accepted length τ (tokens per target forward, teacher-forced estimate):", "",
              "| γ | " + " | ".join(str(g) for g in m["tau_chain"]) + " |",
              "|---|" + "---:|" * len(m["tau_chain"]),
              "| τ | " + " | ".join(f"{t:.2f}" for t in m["tau_chain"].values()) + " |", ""]
    return "\n".join(lines)


def _parent_words(shape: dict) -> str:
    if shape.get("parent_mlp"):
        return "the token at k−1 enters position k's block and a low-rank bias of its logits"
    return "low-rank previous-token bias"


def _feature_term(settings: dict) -> str:
    weight = settings.get("feature_weight", 0.0)
    return (f" + {weight}·smooth-L1 of each position's hidden state to the target's LM-head input there"
            if weight else "")


def train_parallel(lm, settings: TrainSettings, out: str | Path, *, prompts: Sequence[Sequence[int]] | None = None,
                   progress: bool = True, title: str | None = None) -> TrainReport:
    """Whole pipeline: prompts -> cached distillation data -> training -> calibration -> weights at
    `out` (float16 safetensors) and the model card next to it (same name, .md)."""
    settings.drafter_shape(lm)                 # its checks before the data (maybe an hour)
    prompts, data, source = distill_set(lm, settings, progress, prompts)
    data = drafter_data(lm, prompts, data, settings.feature_layer_ids, batch_size=settings.gen_batch,
                        progress=progress)
    drafter, report = train_drafter(lm, data, settings, progress=progress)
    report.data["prompt_source"] = source
    report.data["target_display"] = display_name(lm)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    drafter.save(out, meta={"target": lm.name, **target_meta(lm), "metrics": report.metrics, "data": report.data})
    return finish(report, out, lambda r: model_card(r, title or f"Parallel drafter for {display_name(lm)}"))


TRAINER = Trainer("python -m decoding train parallel", "train the parallel (dspark) drafter by self-distillation",
                  TrainSettings, PARALLEL_WEIGHTS, "dspark", train_parallel,
                  lambda r: tau_summary(r.metrics["tau_chain"]))
build_parser, main_train_parallel = TRAINER.parser, TRAINER.main
