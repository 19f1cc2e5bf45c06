"""Train the shallow self-draft (decoding/drafters/shallow.py) by distillation from the target, on this CPU.

Data: the same cached self-distillation set as the parallel drafter (decoding/train/parallel.py generate_distill:
the target's greedy answers to varied prompts with its top-k soft labels), so a second trainer costs no
second generation. Each sequence is prompt + answer; the draft reads it with teacher forcing and at every
answer position is trained toward the target: cross-entropy to the target's token plus `soft_weight` ×
cross-entropy to its top-k (renormalised over the slice). Only the adapter layers, the norm copy and the
head bias train; the shared target layers are frozen.

Evaluation on held-out prompts (teacher forced, which at temperature 0 is exactly what verification sees,
since accepted drafts equal the target's tokens): top-1 agreement, and for each γ the chain's mean
accepted length τ = 1 + E[leading hits among the next γ], averaged over all start positions.

Entry point: `python -m decoding train draft [flags]`.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from decoding.core.errors import check, check_number
from decoding.drafters.shallow import DEFAULT_SHALLOW, build_shallow, check_shape, save_shallow, trainable
from decoding.train.common import TrainedReport, Trainer, display_name, finish, lead_metrics, tau_summary
from decoding.train.data import DataSettings, DistillData, data_split, distill_set


@dataclass(frozen=True)
class DraftSettings(DataSettings):
    layers: int = 2              # target layers reused (frozen, shared)
    adapters: int = 1            # trained layers on top (initialised from target layers L..L+A−1)
    steps: int = 2000
    batch_size: int = 8          # sequences per step
    lr: float = 3e-4
    soft_weight: float = 1.0
    vocab_extra: int = 2         # slice = tokens seen in answers ∪ the target's top-`vocab_extra` there
    max_minutes: float = 28.0    # training stops early at this wall-clock budget

    def __post_init__(self):
        super().__post_init__()
        for name in ("steps", "batch_size"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 1, name, v, "must be an integer >= 1")
        for name in ("lr", "max_minutes"):
            check_number(name, getattr(self, name), 0, above=True)
        check_number("soft_weight", self.soft_weight, 0)
        check(isinstance(self.layers, int) and self.layers >= 1, "layers", self.layers, "must be an integer >= 1")
        for name in ("adapters", "vocab_extra"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 0, name, v, "must be an integer >= 0")


@dataclass(frozen=True)
class Sequences:
    """Prompt + answer token rows with the answer's labels, one entry per distilled sequence."""

    ids: list[list[int]]          # full sequence (prompt + answer)
    starts: list[int]             # index of the first answer token
    rows: list[range]             # the answer's rows in the DistillData


def sequences(prompts: Sequence[Sequence[int]], data: DistillData) -> Sequences:
    ids, starts, rows = [], [], []
    for s, prompt in enumerate(prompts):
        a, b = int(data.offsets[s]), int(data.offsets[s + 1])
        ids.append(list(prompt) + data.tokens[a:b].tolist())
        starts.append(len(prompt))
        rows.append(range(a, b))
    return Sequences(ids, starts, rows)


def vocab_slice(data: DistillData, eos_ids, extra: int) -> list[int]:
    seen = set(data.tokens.tolist()) | set(eos_ids)
    if extra > 0:
        seen |= set(data.soft_ids[:, :extra].flatten().tolist())
    return sorted(seen)


def _batch(seqs: Sequences, data: DistillData, pick: Sequence[int], slice_of: torch.Tensor, device):
    """Right-padded ids/mask, flat (batch, position) indices of the answer-predicting positions, hard
    labels and soft labels, in slice indices (−1: outside the slice)."""
    width = max(len(seqs.ids[s]) for s in pick)
    ids = torch.zeros((len(pick), width), dtype=torch.long)
    mask = torch.zeros((len(pick), width), dtype=torch.long)
    where, rows = [], []
    for b, s in enumerate(pick):
        seq = seqs.ids[s]
        ids[b, :len(seq)] = torch.tensor(seq)
        mask[b, :len(seq)] = 1
        n = len(seqs.rows[s])
        where += [(b, seqs.starts[s] - 1 + j) for j in range(n)]   # position predicting answer token j
        rows += list(seqs.rows[s])
    rows_t = torch.tensor(rows, dtype=torch.long)
    pos = torch.tensor(where, dtype=torch.long).reshape(-1, 2)
    labels = slice_of[data.tokens[rows_t]]
    soft_ids = slice_of[data.soft_ids[rows_t].long()]
    return ids.to(device), mask.to(device), pos, labels, soft_ids, data.soft_probs[rows_t].float()


def slice_logits_at(draft, ids, mask, pos) -> torch.Tensor:
    """Teacher-forced draft logits over the slice at the (batch, position) pairs `pos`: (N, V_s)."""
    hidden = draft.model.model(input_ids=ids, attention_mask=mask).last_hidden_state   # (B, T, H)
    picked = hidden[pos[:, 0], pos[:, 1]]                                              # (N, H)
    return draft.model.lm_head.slice_logits(picked).float()


def loss_of(logits, labels, soft_ids, soft_probs, soft_weight: float):
    logq = torch.log_softmax(logits, -1)                                               # (N, V_s)
    valid = labels >= 0
    ce = F.nll_loss(logq[valid], labels[valid]) if valid.any() else logq.sum() * 0
    in_slice = soft_ids >= 0                                                           # (N, k)
    p = soft_probs * in_slice
    p = p / p.sum(-1, keepdim=True).clamp(min=1e-6)
    soft = -(p * logq.gather(-1, soft_ids.clamp(min=0))).sum(-1).mean()
    hits = (logits.argmax(-1) == labels) & valid
    return ce + soft_weight * soft, hits


@torch.no_grad()
def evaluate(draft, seqs: Sequences, data: DistillData, held: Sequence[int], slice_of, gammas=(1, 2, 3, 4, 5, 6, 8)):
    """Held-out top-1 agreement, per-position acceptance and the chain's τ for each γ (teacher forced)."""
    hit_rows = []
    for i in range(0, len(held), 8):
        pick = list(held[i:i + 8])
        ids, mask, pos, labels, _, _ = _batch(seqs, data, pick, slice_of, draft.device)
        hits = (slice_logits_at(draft, ids, mask, pos).argmax(-1).cpu() == labels) & (labels >= 0)
        offset = 0
        for s in pick:
            n = len(seqs.rows[s])
            hit_rows.append(hits[offset:offset + n])
            offset += n
    return chain_metrics(hit_rows, gammas)


def chain_metrics(hit_rows: Sequence[torch.Tensor], gammas: Sequence[int]) -> dict:
    """From per-sequence hit vectors: top-1 agreement; for each γ, τ = 1 + mean leading hits over start
    positions with a full window, and per-position acceptance (accepted at k / rounds that drafted k)."""
    allhits = torch.cat(list(hit_rows)) if hit_rows else torch.zeros(0, dtype=torch.bool)
    g_max = max(gammas)
    leads = [int(torch.cumprod(row[start:start + g_max].int(), 0).sum())
             for row in hit_rows for start in range(0, max(len(row) - g_max, 0))]
    top1 = float(allhits.float().mean()) if len(allhits) else math.nan
    return lead_metrics(torch.tensor(leads, dtype=torch.long), gammas, top1, int(len(allhits)))


@dataclass
class DraftReport(TrainedReport):
    before: dict
    after: dict
    train_top1: float = math.nan
    target: str = ""   # agreement on (up to 64) training sequences: shows over-fitting
    weights: str = ""
    size_bytes: int = 0


def train_draft(lm, settings: DraftSettings, prompts: Sequence[Sequence[int]], data: DistillData,
                progress: bool = True):
    """-> (draft LM, DraftReport). Trains in float32 on the target's device."""
    from tqdm import tqdm

    seqs = sequences(prompts, data)
    train_ids, held_ids = data_split(data, settings.heldout_every)
    ids_slice = vocab_slice(data.subset(train_ids), lm.eos_ids, settings.vocab_extra)
    draft = build_shallow(lm, settings.layers, settings.adapters, ids_slice)
    slice_of = torch.full((lm.vocab_size,), -1, dtype=torch.long)
    slice_of[torch.tensor(ids_slice)] = torch.arange(len(ids_slice))
    held = held_ids or train_ids[:8]
    before = evaluate(draft, seqs, data, held, slice_of)
    for p in draft.model.parameters():
        p.requires_grad_(False)
    params = trainable(draft)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=settings.lr, total_steps=settings.steps, pct_start=0.05)
    gen = torch.Generator().manual_seed(settings.seed)
    start, loss_avg, done = time.perf_counter(), None, 0
    bar = tqdm(range(settings.steps), desc="train draft", unit="step", disable=not progress)
    draft.model.train()
    for _ in bar:
        pick = [train_ids[int(i)] for i in torch.randint(len(train_ids), (settings.batch_size,), generator=gen)]
        ids, mask, pos, labels, soft_ids, soft_probs = _batch(seqs, data, pick, slice_of, draft.device)
        loss, hits = loss_of(slice_logits_at(draft, ids, mask, pos), labels, soft_ids, soft_probs,
                             settings.soft_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        done += 1
        value = float(loss.detach())
        loss_avg = value if loss_avg is None else 0.95 * loss_avg + 0.05 * value
        bar.set_postfix(loss=f"{loss_avg:.3f}", top1=f"{float(hits.float().mean()):.2f}")
        if time.perf_counter() - start > 60 * settings.max_minutes:
            break
    draft.model.eval()
    for p in draft.model.parameters():
        p.requires_grad_(False)
    seconds = round(time.perf_counter() - start, 1)
    after = evaluate(draft, seqs, data, held, slice_of)
    fit = evaluate(draft, seqs, data, train_ids[:64], slice_of)["top1"]
    report = DraftReport(settings=asdict(settings), data=dict(data.info),
                         shape={"layers": settings.layers, "adapters": settings.adapters,
                                "vocab_slice": len(ids_slice)},
                         params=sum(p.numel() for p in params), steps=done, seconds=seconds,
                         final_loss=round(loss_avg if loss_avg is not None else math.nan, 4), before=before,
                         after=after,
                         train_top1=fit)
    report.data.update(train_sequences=len(train_ids), heldout_sequences=len(held_ids))
    return draft, report


def changed_flags(settings: dict, settings_type=DraftSettings) -> str:
    """The command-line flags that differ from `settings_type`'s defaults (" --steps 2000 ..."; "" if none)."""
    defaults = asdict(settings_type())
    return "".join(f" --{k.replace('_', '-')} {v}" for k, v in settings.items() if k in defaults and defaults[k] != v)


def budget_note(report) -> str:
    """ " (N planned; stopped by the M-minute budget)" when the time budget ended training, else "". """
    planned = report.settings["steps"]
    if report.steps >= planned:
        return ""
    return f" ({planned} planned; stopped by the {report.settings['max_minutes']}-minute budget)"


def model_card(report: DraftReport, title: str) -> str:
    """Markdown from the report only: data, run, held-out agreement and acceptance before/after training."""
    d, s, a, b = report.data, report.settings, report.after, report.before
    gammas = list(a["tau_chain"])
    lines = [f"# {title}", "",
             f"Shallow self-draft for DecodeScope's `speculative` strategy (`--draft shallow`): the target's first "
             f"{report.shape['layers']} layers (shared), {report.shape['adapters']} trained layer(s) of the target's "
             f"architecture, a trained final-norm copy, and the target's LM head over a "
             f"{report.shape['vocab_slice']}-token "
             f"slice with a trained bias. Generated by `python -m decoding train draft{changed_flags(s)}` from the run "
             "below.", "",
             "## Data", "",
             f"- target `{report.target}`; its {'greedy' if not d.get('temperature') else 'sampled'} answers "
             f"(up to {d.get('answer_tokens')} tokens) to {d.get('prompts')} varied prompts, "
             f"top-{d.get('soft_k')} soft labels",
             f"- {d.get('train_sequences')} sequences for training, {d.get('heldout_sequences')} held out "
             f"(one base prompt in {s['heldout_every']}, with all its variants)", "",
             "## Training", "",
             f"- {report.params:,} trained parameters; file {report.size_bytes / 1e6:.1f} MB (float16)",
             f"- {report.steps} steps of {s['batch_size']} sequences{budget_note(report)}, AdamW lr {s['lr']} "
             "one-cycle, loss = CE + "
             f"{s['soft_weight']}·soft CE; {report.seconds} s on the training machine; "
             f"final loss {report.final_loss}", "",
             f"## Held-out results ({a['positions']} answer positions, teacher forced = greedy verification)", "",
             f"- top-1 agreement with the target: {b['top1']:.3f} untrained (early exit at layer "
             f"{report.shape['layers'] + report.shape['adapters']}) → {a['top1']:.3f} trained "
             f"({report.train_top1:.3f} on training sequences)", "",
             "| γ | " + " | ".join(str(g) for g in gammas) + " |",
             "|---|" + "---:|" * len(gammas),
             "| τ untrained | " + " | ".join(f"{b['tau_chain'][g]:.2f}" for g in gammas) + " |",
             "| τ trained | " + " | ".join(f"{a['tau_chain'][g]:.2f}" for g in gammas) + " |", "",
             "Per-position acceptance (accepted at k / rounds that drafted k, γ = " f"{max(gammas)}):", "",
             "| k | " + " | ".join(str(p["position"]) for p in a["per_position"]) + " |",
             "|---|" + "---:|" * len(a["per_position"]),
             "| trained | " + " | ".join(f"{p['accept_given_prefix']:.2f}" for p in a["per_position"]) + " |", ""]
    return "\n".join(lines)


def train_shallow(lm, settings: DraftSettings, out: str | Path, *, prompts=None, progress: bool = True,
                  title: str | None = None) -> DraftReport:
    """Prompts -> cached distillation data -> training -> weights at `out` and the model card (.md)."""
    check_shape(lm.model, settings.layers, settings.adapters)    # before the data (maybe an hour)
    prompts, data, _ = distill_set(lm, settings, progress, prompts)
    draft, report = train_draft(lm, settings, prompts, data, progress=progress)
    report.target = display_name(lm)
    out = Path(out)
    save_shallow(draft, out, meta={"target": lm.name, "after": report.after, "before": report.before,
                                   "data": report.data, "steps": report.steps})
    return finish(report, out, lambda r: model_card(r, title or f"Shallow draft for {display_name(lm)}"))


TRAINER = Trainer("python -m decoding train draft", "train the shallow self-draft for speculative decoding by "
                  "distillation", DraftSettings, DEFAULT_SHALLOW, "shallow", train_shallow,
                  lambda r: f"top-1 {r.before['top1']:.3f} -> {r.after['top1']:.3f}; "
                            f"{tau_summary(r.after['tau_chain'])}")
build_parser, main_train_draft = TRAINER.parser, TRAINER.main
