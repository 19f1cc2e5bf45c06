"""Self-distillation data, shared by every drafter's trainer: the target's own answers to varied prompts,
with the LM-head inputs (hidden states) and the target's top-k soft labels at every answer position, cached
on disk under <cache>/distill/<key>.pt; feature-layer outputs for drafters that read them; the train and
held-out split; training batches and anchors."""
from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from decoding.core.errors import check, check_number
from decoding.runtime.files import atomic_path, load_from_cache, save_to_cache
from decoding.runtime.hooks import check_feature_layers, decoder_layers, tap_head_input
from decoding.runtime.paths import cache_dir
from decoding.train import answer_store
from decoding.train.greedy_batch import Answer, greedy_rows, left_pad, pad_id, positions_of, stacked

DISTILL_VERSION = 1

# ------------------------------------------------------------------------------ prompts
_TOPICS = (
    "photosynthesis", "the water cycle", "black holes", "the French Revolution", "machine learning",
    "compound interest", "volcanoes", "the immune system", "climate change", "the printing press",
    "electric cars", "honeybees", "the Roman Empire", "quantum computing", "coffee", "sleep",
    "the internet", "earthquakes", "vaccines", "the moon landing", "recycling", "chess", "jazz music",
    "the stock market", "rainforests", "gravity", "democracy", "solar panels", "the human heart",
    "tea ceremonies", "ancient Egypt", "bicycles", "friendship", "time management", "public speaking",
    "ocean tides", "dinosaurs", "the Renaissance", "cryptography", "bread baking", "marathon training",
    "the periodic table", "wind turbines", "octopuses", "the Silk Road", "meditation", "3D printing",
    "inflation", "glaciers", "the violin", "social media", "antibiotics", "the Great Wall of China",
    "electricity", "habits", "coral reefs", "the Olympic Games", "robots", "libraries", "mountains",
    "volunteering", "DNA", "airplanes", "budgeting", "the solar system", "origami", "pandas",
)
_TEMPLATES = (
    "Explain {t} in simple terms.", "Write a short paragraph about {t}.", "Give three facts about {t}.",
    "What are the main advantages and disadvantages of {t}?", "Write a short poem about {t}.",
    "Describe the history of {t} briefly.", "How would you teach {t} to a ten-year-old?",
    "List five questions a student might ask about {t}.", "Write a short story that involves {t}.",
    "Summarize why {t} matters today.", "What is a common misconception about {t}?",
    "Compare {t} with something from everyday life.", "Write a tweet about {t}.",
    "Give step-by-step advice for someone starting to learn about {t}.",
    "What would happen if {t} did not exist?", "Write an encyclopedia-style introduction to {t}.",
)
_CODE = (
    "Write a Python function that reverses a string.", "Write a Python function that checks if a number is prime.",
    "Write a Python function that returns the n-th Fibonacci number.", "Write a SQL query that counts rows per day.",
    "Write a Python function that merges two sorted lists.", "Explain what a hash map is, with an example.",
    "Write a bash command that counts lines in all .txt files.", "Write a Python class for a simple stack.",
    "What is the difference between a list and a tuple in Python?",
    "Write a JavaScript function that debounces another.",
    "Solve: a train travels 120 km in 1.5 hours. What is its average speed?", "What is 17 times 23? Show your work.",
    "Convert 98.6 degrees Fahrenheit to Celsius and explain the steps.", "What is the derivative of x^3 + 2x?",
)


_STYLES = ("", " Keep it brief.", " Use a friendly tone.", " Answer as a numbered list.")


def distill_prompts(n: int, seed: int = 0) -> list[str]:
    """n varied prompts (templates x topics x styles, plus code/maths questions), shuffled by `seed`;
    the first BASE_PROMPTS (1,086) are distinct base prompts, styles vary them beyond that."""
    base = [tpl.format(t=topic) for tpl in _TEMPLATES for topic in _TOPICS] + list(_CODE)
    random.Random(seed).shuffle(base)
    pool = [text + style for style in _STYLES for text in base]
    check(1 <= n <= len(pool), "prompts", n, f"must be in [1, {len(pool)}]")
    return pool[:n]


# ------------------------------------------------------------------------------ data
@dataclass
class DistillData:
    """Answer positions of all sequences, concatenated. Row i: answer token i, the LM-head input that
    produced it (the hidden state at the previous position) and the target's top-k there."""

    tokens: torch.Tensor        # (N,) long
    hidden: torch.Tensor        # (N, H) float16
    soft_ids: torch.Tensor      # (N, k) int32
    soft_probs: torch.Tensor    # (N, k) float16
    offsets: torch.Tensor       # (S + 1,) long: sequence s is rows offsets[s]:offsets[s + 1]
    info: dict = field(default_factory=dict)

    @property
    def positions(self) -> int:
        return int(self.tokens.shape[0])

    def to(self, device) -> DistillData:
        return DistillData(*(getattr(self, k).to(device) for k in ("tokens", "hidden", "soft_ids", "soft_probs",
                                                                   "offsets")), dict(self.info))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            torch.save({**{k: getattr(self, k) for k in ("tokens", "hidden", "soft_ids", "soft_probs", "offsets")},
                        "info": self.info}, tmp)

    @classmethod
    def load(cls, path: Path) -> DistillData:
        return cls(**torch.load(path, weights_only=True))

    @classmethod
    def concat(cls, parts: Sequence[DistillData]) -> DistillData:
        """The sequences of all parts in order; info["parts"] lists each part's number of sequences (a part
        that is itself a concatenation counts as its parts)."""
        shift = torch.tensor([0] + [int(p.offsets[-1]) for p in parts]).cumsum(0)
        offsets = torch.cat([parts[0].offsets[:1]] + [p.offsets[1:] + shift[i] for i, p in enumerate(parts)])
        info = dict(parts[0].info, parts=[n for p in parts for n in p.info.get("parts", [len(p.offsets) - 1])],
                    keys=[k for p in parts for k in p.info.get("keys", [p.info.get("key")])], positions=int(shift[-1]),
                    prompts=sum(len(p.offsets) - 1 for p in parts),
                    seconds=round(sum(p.info.get("seconds", 0.0) for p in parts), 1))
        return cls(*(torch.cat([getattr(p, k) for p in parts]) for k in ("tokens", "hidden", "soft_ids", "soft_probs")),
                   offsets, info)

    def answer(self, seq: int) -> list[int]:
        return self.tokens[int(self.offsets[seq]):int(self.offsets[seq + 1])].tolist()

    def subset(self, seqs: Sequence[int]) -> DistillData:
        rows = [torch.arange(int(self.offsets[s]), int(self.offsets[s + 1])) for s in seqs]
        idx = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        return DistillData(self.tokens[idx], self.hidden[idx], self.soft_ids[idx], self.soft_probs[idx],
                           offsets, dict(self.info))


def estimate_bytes(n_prompts: int, answer_tokens: int, hidden: int, soft_k: int) -> int:
    """Upper bound of the cached data size: per position hidden f16 + token + soft ids/probs."""
    return n_prompts * answer_tokens * (2 * hidden + 8 + soft_k * (4 + 2))


@torch.inference_mode()
def _generate(lm, ids, mask, answer_tokens: int, temperature: float, seed: int) -> torch.Tensor:
    eos = sorted(lm.eos_ids)
    kwargs = {"max_new_tokens": answer_tokens, "pad_token_id": pad_id(lm), "eos_token_id": eos or None}
    if temperature > 0:
        kwargs.update(do_sample=True, temperature=float(temperature), top_k=0, top_p=1.0)
    else:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = lm.model.generate(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device), **kwargs)
    return out[:, ids.shape[1]:].cpu()                                     # (B, N')


@dataclass(frozen=True)
class _Generation:
    """How generate_distill makes the answers it does not find stored."""

    answer_tokens: int
    batch_size: int
    temperature: float
    soft_k: int
    seed: int
    progress: bool


def _answers(lm, prompts, gen: _Generation) -> list[Answer]:
    """The target's answers: greedy ones batched by length with their rows (greedy_batch), sampled ones by
    generate (tokens only: a teacher-forced pass computes their rows)."""
    if gen.temperature == 0:
        return greedy_rows(lm, prompts, gen.answer_tokens, gen.batch_size, gen.soft_k, gen.progress)
    return [Answer(a) for a in generate_answers(lm, prompts, gen.answer_tokens, gen.batch_size, gen.temperature,
                                                gen.seed)]


def generate_answers(lm, prompts, answer_tokens: int, batch_size: int, temperature: float, seed: int
                     ) -> list[list[int]]:
    """Answers by transformers' generate on batches of prompts in order, one seed per batch."""
    out = []
    for b, b0 in enumerate(range(0, len(prompts), batch_size)):
        ids, mask = left_pad([list(p) for p in prompts[b0:b0 + batch_size]], pad_id(lm))
        answers = _generate(lm, ids, mask, answer_tokens, temperature, seed + b)
        out += [answers[i, :n].tolist() for i, n in enumerate(_answer_lengths(answers, lm.eos_ids))]
    return out


def _answer_lengths(answers: torch.Tensor, eos_ids) -> list[int]:
    lengths = []
    for row in answers.tolist():
        n = len(row)
        for i, t in enumerate(row):
            if t in eos_ids:
                n = i + 1
                break
        lengths.append(n)
    return lengths


def _forced_forward(lm, ids, mask, answers):
    """The target's decoder over left-padded prompts (B, L) + answers (B, N), positions from the mask."""
    full = torch.cat([ids, answers], 1)                                    # (B, L + N)
    fmask = torch.cat([mask, torch.ones_like(answers)], 1)                 # (B, L + N)
    positions = positions_of(fmask)                                        # (B, L + N)
    return lm.model.get_decoder()(input_ids=full.to(lm.device), attention_mask=fmask.to(lm.device),
                                  position_ids=positions.to(lm.device))


@torch.inference_mode()
def _teacher_pass(lm, ids, mask, answers, lengths, soft_k: int):
    """One forward over prompt + answer: LM-head inputs and top-k soft labels at answer positions."""
    hidden = _forced_forward(lm, ids, mask, answers).last_hidden_state     # (B, L + N, H)
    head = lm.model.get_output_embeddings()
    start = ids.shape[1] - 1
    rows = [hidden[b, start:start + n] for b, n in enumerate(lengths)]    # each (n, H)
    h = torch.cat(rows)                                                     # (n_all, H)
    ids_out, probs_out = [], []
    for chunk in h.split(256):          # full-vocabulary rows only 256 at a time
        top = torch.topk(torch.softmax(head(chunk).float(), -1), soft_k, -1)  # (256, k)
        ids_out.append(top.indices.int().cpu())
        probs_out.append(top.values.half().cpu())
    tokens = torch.cat([answers[b, :n] for b, n in enumerate(lengths)])
    return tokens, h.half().cpu(), torch.cat(ids_out), torch.cat(probs_out)


def _teacher_rows(lm, prompts, answers_all, batch_size: int, soft_k: int, progress: bool):
    """(tokens, hidden, soft ids, soft probs) of every answer position, by teacher-forced passes."""
    from tqdm import tqdm

    pad, parts = pad_id(lm), []
    for b0 in tqdm(range(0, len(prompts), batch_size), desc="teacher pass", unit="batch", disable=not progress):
        ids, mask = left_pad([list(p) for p in prompts[b0:b0 + batch_size]], pad)
        answers, lengths = _padded(answers_all[b0:b0 + batch_size], pad)
        parts.append(_teacher_pass(lm, ids, mask, answers, lengths, soft_k))
    return tuple(torch.cat(x) for x in zip(*parts))


def distill_key(lm, prompts: Sequence[Sequence[int]], answer_tokens: int, temperature: float, soft_k: int,
                seed: int) -> str:
    head = lm.model.get_output_embeddings().weight
    weights = hashlib.sha1(head.detach().float().cpu().flatten()[:4096].numpy().tobytes()).hexdigest()
    blob = json.dumps({"v": DISTILL_VERSION, "model": lm.name, "weights": weights, "vocab": lm.vocab_size,
                       "hidden": int(lm.model.config.hidden_size), "prompts": [list(p) for p in prompts],
                       "n": answer_tokens, "t": temperature, "k": soft_k, "seed": seed})
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def generate_distill(lm, prompts: Sequence[Sequence[int]], *, answer_tokens: int = 128, batch_size: int = 32,
                     temperature: float = 0.0, soft_k: int = 8, seed: int = 0, use_cache: bool = True,
                     progress: bool = True) -> DistillData:
    """The target's answers to `prompts` (token ids) with hidden states and soft labels; cached."""
    check(len(prompts) >= 1 and all(len(p) >= 1 for p in prompts), "prompts", len(prompts),
          "need at least one non-empty prompt")
    key = distill_key(lm, prompts, answer_tokens, temperature, soft_k, seed)
    path = cache_dir("distill") / f"{key}.pt"
    cached = load_from_cache(DistillData.load, path) if use_cache else None
    if cached is not None:
        return cached
    start = time.perf_counter()
    stored = answer_store.load_matching(key, prompts) if use_cache else None
    answers = ([Answer(list(a)) for a in stored.answers] if stored is not None else
               _answers(lm, prompts, _Generation(answer_tokens, batch_size, temperature, soft_k, seed, progress)))
    answers_all = [a.tokens for a in answers]
    tokens, hidden, soft_ids, soft_probs = (stacked(answers) if answers[0].hidden is not None else
                                            _teacher_rows(lm, prompts, answers_all, batch_size, soft_k, progress))
    lengths_all = [len(a) for a in answers_all]
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(lengths_all).cumsum(0)])
    seconds = round(time.perf_counter() - start, 1)
    info = {"model": lm.name, "prompts": len(prompts), "answer_tokens": answer_tokens, "temperature": temperature,
            "soft_k": soft_k, "positions": int(tokens.shape[0]), "seconds": seconds, "key": key,
            "answers": "generated" if stored is None else f"stored ({stored.info.get('source', 'answers file')})"}
    data = DistillData(tokens.long(), hidden, soft_ids, soft_probs, offsets, info)
    if use_cache:
        save_to_cache(data.save, path)
        if stored is None:
            answer_set = answer_store.AnswerSet(tuple(tuple(int(t) for t in p) for p in prompts),
                                                tuple(tuple(a) for a in answers_all),
                                                {"model": lm.name, "key": key, "answer_tokens": answer_tokens,
                                                 "temperature": temperature, "seed": seed, "seconds": seconds})
            save_to_cache(answer_set.save, cache_dir("distill") / answer_store.file_name(key))
    return data


def _padded(answers: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, list[int]]:
    """Stored answers as generate returns them: (B, N) with `pad` after each one's end, and their lengths."""
    width = max(len(a) for a in answers)
    out = torch.full((len(answers), width), pad, dtype=torch.long)
    for i, a in enumerate(answers):
        out[i, :len(a)] = torch.tensor(a, dtype=torch.long)
    return out, [len(a) for a in answers]


@torch.inference_mode()
def _layer_pass(lm, prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]], layers: Sequence[int]):
    """One teacher-forced forward over left-padded prompts + answers: the outputs of decoder `layers` at
    each answer row's producing position (where the LM-head input of DistillData.hidden is read)."""
    pad = pad_id(lm)
    ids, mask = left_pad([list(p) for p in prompts], pad)
    ans, _ = _padded(answers, pad)                                         # (B, N) padded after the end
    with tap_head_input(lm, layers) as tap:      # the same hooks that feed the drafter when decoding
        _forced_forward(lm, ids, mask, ans)
    start = ids.shape[1] - 1
    outs = [tap.layer_outputs[i].to("cpu") for i in layers]                # each (B, L + N, H)
    return torch.cat([torch.stack([o[b, start:start + len(a)] for o in outs], 1)      # (n, E, H)
                      for b, a in enumerate(answers)]).half()


def layer_features_path(lm, prompts: Sequence[Sequence[int]], data: DistillData, layers: Sequence[int]) -> Path:
    """Cache file of layer_features: keyed by the model, the layers, the prompts and the answers."""
    rows = hashlib.sha1(data.tokens.numpy().tobytes() + data.offsets.numpy().tobytes()).hexdigest()
    key = hashlib.sha1(json.dumps({"v": DISTILL_VERSION, "model": lm.name, "layers": list(layers), "rows": rows,
                                   "prompts": [list(p) for p in prompts]}).encode()).hexdigest()[:16]
    return cache_dir("distill") / f"layers-{key}.pt"


def layer_features(lm, prompts: Sequence[Sequence[int]], data: DistillData, layers: Sequence[int], *,
                   batch_size: int = 32, use_cache: bool = True, progress: bool = True) -> torch.Tensor:
    """(N, E, H) float16: the outputs of decoder `layers` at every row of `data` (the answers to
    `prompts`), for a drafter that reads feature layers; one forward per batch, cached."""
    check(len(layers) >= 1, "feature_layers", list(layers), "name at least one decoder layer")
    check_feature_layers(layers, len(decoder_layers(lm)))
    check(len(prompts) == len(data.offsets) - 1, "prompts", len(prompts),
          f"must be the {len(data.offsets) - 1} prompts the data answers")
    path = layer_features_path(lm, prompts, data, layers)
    cached = load_from_cache(lambda p: torch.load(p, weights_only=True), path) if use_cache else None
    if cached is not None:
        return cached
    from tqdm import tqdm

    chunks = []
    for b0 in tqdm(range(0, len(prompts), batch_size), desc="feature layers", unit="batch", disable=not progress):
        seqs = range(b0, min(len(prompts), b0 + batch_size))
        chunks.append(_layer_pass(lm, [prompts[s] for s in seqs], [data.answer(s) for s in seqs], layers))
    feats = torch.cat(chunks)                                               # (N, E, H)
    if use_cache:
        save_to_cache(lambda p: save_tensors(feats, p), path)
    return feats


def save_tensors(obj, path: Path) -> None:
    """torch.save of `obj` to `path`, atomically."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def with_features(data: DistillData, feats: torch.Tensor) -> DistillData:
    """The data with each row's hidden extended by its feature-layer outputs: (N, H·(1 + E))."""
    check(feats.shape[0] == data.positions, "features", tuple(feats.shape),
          f"need one row per position ({data.positions})")
    return DistillData(data.tokens, torch.cat([data.hidden, feats.flatten(1).to(data.hidden.dtype)], 1),
                       data.soft_ids, data.soft_probs, data.offsets, dict(data.info))


def drafter_data(lm, prompts: Sequence[Sequence[int]], data: DistillData, feature_layers: Sequence[int], **kw
                 ) -> DistillData:
    """`data` as a drafter reading `feature_layers` needs it (unchanged for none)."""
    return with_features(data, layer_features(lm, prompts, data, feature_layers, **kw)) if feature_layers else data


# ------------------------------------------------------------------------------ batches
@dataclass(frozen=True)
class Batch:
    hidden: torch.Tensor     # (B, H)
    root: torch.Tensor       # (B,)
    parents: torch.Tensor    # (B, γ) true token at k−1 (root first)
    labels: torch.Tensor     # (B, γ) slice index of the target's token; −1 outside the slice, −2 past the end
    soft_ids: torch.Tensor   # (B, γ, k) slice indices, −1 outside
    soft_probs: torch.Tensor  # (B, γ, k)
    future: torch.Tensor | None = None   # (B, γ, H) LM-head input that produced the label (make_batch's future_width)


def anchors(data: DistillData) -> torch.Tensor:
    """Rows that have at least one following token in their sequence."""
    out = [torch.arange(int(a), int(b) - 1) for a, b in zip(data.offsets[:-1], data.offsets[1:]) if b - a >= 2]
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def sequence_ends(data: DistillData, rows: torch.Tensor) -> torch.Tensor:
    """(N,) the end row (exclusive) of each row's sequence."""
    return data.offsets[torch.searchsorted(data.offsets, rows, right=True)]


def make_batch(data: DistillData, rows: torch.Tensor, gamma: int, slice_of: torch.Tensor,
               future_width: int = 0) -> Batch:
    """Row i: input (hidden[i], tokens[i]); position k (1..γ) predicts tokens[i + k] when it is in the
    same sequence. With `future_width` H > 0 also the LM-head input that produced that token (the first H
    columns of hidden[i + k]; past the sequence end the anchor's own, which the label −2 masks)."""
    seq_end = sequence_ends(data, rows)                                                # (B,)
    steps = torch.arange(1, gamma + 1)                                                  # (γ,)
    target = rows[:, None] + steps                                                      # (B, γ)
    valid = target < seq_end[:, None]                                                   # (B, γ)
    safe = torch.where(valid, target, rows[:, None])                                    # (B, γ)
    labels = torch.where(valid, slice_of[data.tokens[safe]], -2)                        # (B, γ)
    parents = data.tokens[torch.where(valid, safe - 1, rows[:, None])]                  # (B, γ)
    soft_ids = slice_of[data.soft_ids[safe].long()]                                     # (B, γ, k)
    soft_ids = torch.where(valid[..., None], soft_ids, -1)
    ahead = data.hidden[safe][..., :future_width].float() if future_width else None      # (B, γ, H)
    return Batch(data.hidden[rows].float(), data.tokens[rows], parents, labels, soft_ids,
                 data.soft_probs[safe].float(), ahead)


def history_rows(data: DistillData, rows: torch.Tensor, span: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per anchor row the `span` rows ending at it (oldest first), as the decoder's history holds them:
    rows before its sequence's first are invalid (and point at the anchor). -> (rows (B, S), valid)."""
    start = data.offsets[torch.searchsorted(data.offsets, rows, right=True) - 1]     # (B,)
    window = rows[:, None] + torch.arange(1 - span, 1)                                 # (B, S)
    valid = window >= start[:, None]
    return torch.where(valid, window, rows[:, None]), valid


def training_chunks(data: DistillData, pool: torch.Tensor, gen: torch.Generator, n_chunks: int, length: int,
                    span: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n_chunks runs of `length` consecutive anchors, each after span − 1 rows of history, so the
    backbone encodes every row once and each anchor sees the window it sees when decoding. A run
    covers a random anchor at a random offset, clipped at its sequence's start.
    -> (rows (C, T), valid (C, T), is_anchor (C, T)), T = span − 1 + length."""
    pick = pool[torch.randint(len(pool), (n_chunks,), generator=gen)]                  # (C,)
    seq = torch.searchsorted(data.offsets, pick, right=True) - 1
    first, end = data.offsets[seq], data.offsets[seq + 1]                              # (C,)
    start = torch.maximum(first, pick - torch.randint(length, (n_chunks,), generator=gen))
    offset = torch.arange(1 - span, length)                                            # (T,)
    rows = start[:, None] + offset                                                     # (C, T)
    valid = (rows >= first[:, None]) & (rows < end[:, None])
    is_anchor = valid & (offset >= 0) & (rows < end[:, None] - 1)
    return torch.where(valid, rows, start[:, None]), valid, is_anchor


@dataclass(frozen=True)
class DataSettings:
    """The self-distillation data every trainer reads (distill_set) and its held-out split; each trainer's
    settings extend it."""

    heldout_every: int = 16      # every 16th prompt is held out
    n_prompts: int = 1024        # templated prompts (decoding.train.data.distill_prompts)
    prompt_pool: str = "mixed"   # templates | mixed (templates + n_varied prompts of decoding.train.prompt_pool)
    n_varied: int = 1024
    n_extra: int = 1024          # mixed only: a third part, the next n_extra varied prompts (cached on its own)
    n_follow_up: int = 0         # mixed only: two-turn conversations on the parts before, in parts of 1,024
    answer_tokens: int = 128
    gen_batch: int = 32
    gen_temperature: float = 0.0
    soft_k: int = 8
    seed: int = 0

    def __post_init__(self):
        for name in ("n_prompts", "answer_tokens", "gen_batch", "soft_k", "n_varied"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 1, name, v, "must be an integer >= 1")
        for name in ("n_extra", "n_follow_up"):
            v = getattr(self, name)
            check(isinstance(v, int) and v >= 0, name, v, "must be an integer >= 0")
        check(self.prompt_pool in POOLS, "prompt_pool", self.prompt_pool, "choose templates or mixed")
        check(isinstance(self.heldout_every, int) and self.heldout_every >= 2, "heldout_every",
              self.heldout_every, "must be an integer >= 2")
        check_number("gen_temperature", self.gen_temperature, 0)


BASE_PROMPTS = len(_TEMPLATES) * len(_TOPICS) + len(_CODE)


def split_sequences(n_seqs: int, every: int, period: int = BASE_PROMPTS) -> tuple[list[int], list[int]]:
    """(train, held out): one base prompt in `every` is held out, with all its style variants
    (distill_prompts repeats the base prompts with a new style every `period` prompts)."""
    held = [s for s in range(n_seqs) if (s % period) % every == every - 1]
    return [s for s in range(n_seqs) if (s % period) % every != every - 1], held


def split_parts(parts: Sequence[int], every: int) -> tuple[list[int], list[int]]:
    """(train, held out) over concatenated parts: the templated first part as split_sequences does,
    every `every`-th prompt of each later part."""
    train, held, base = [], [], 0
    for i, n in enumerate(parts):
        tr, he = split_sequences(n, every) if i == 0 else split_sequences(n, every, period=n)
        train += [base + s for s in tr]
        held += [base + s for s in he]
        base += n
    return train, held


def data_split(data: DistillData, every: int) -> tuple[list[int], list[int]]:
    return split_parts(data.info.get("parts", [len(data.offsets) - 1]), every)


POOLS = ("templates", "mixed")


def distill_set(lm, settings, progress: bool = True, prompts: Sequence[Sequence[int]] | None = None
                ) -> tuple[list[list[int]], DistillData, str]:
    """(prompts as token ids, data, description): the given prompts, or settings.prompt_pool's. "mixed"
    adds varied prompts (decoding.train.prompt_pool) whose passages are the target's answers to the training
    templated prompts, then follow-up conversations on the training prompts of those parts; each part is
    generated and cached on its own."""
    gen = {"answer_tokens": settings.answer_tokens, "batch_size": settings.gen_batch,
           "temperature": settings.gen_temperature, "soft_k": settings.soft_k, "seed": settings.seed,
           "progress": progress}
    if prompts is not None:
        return [list(p) for p in prompts], generate_distill(lm, prompts, **gen), "given as token ids"
    check(lm.tokenizer is not None, "prompts", None, "a model without a tokenizer needs token-id prompts")
    first_texts = distill_prompts(settings.n_prompts, settings.seed)
    first = [lm.encode(text) for text in first_texts]
    data = generate_distill(lm, first, **gen)
    source = f"{len(first)} templates x topics (decoding.train.data.distill_prompts, seed {settings.seed})"
    if settings.prompt_pool == "templates":
        return first, data, source + ", chat template"
    texts, varied = _varied_parts(lm, settings, data)
    parts = [[lm.encode(text) for text in part] for part in varied]
    data = DistillData.concat([data] + [generate_distill(lm, part, **gen) for part in parts])
    source += (f" + {sum(map(len, parts))} varied prompts (decoding.train.prompt_pool: text tasks on the target's "
               "own answers, advice, code, other writing)")
    if settings.n_follow_up:
        chats = _training_chats(lm, data, first_texts + texts, settings.heldout_every)
        follow = _follow_up_parts(lm, chats, settings.n_follow_up, settings.seed)
        data = DistillData.concat([data] + [generate_distill(lm, part, **gen) for part in follow])
        parts += follow
        source += f" + {settings.n_follow_up} follow-up conversations on their training prompts"
    return first + [p for part in parts for p in part], data, source + ", chat template"


FOLLOW_UP_PART = 1024


def _varied_parts(lm, settings, data: DistillData) -> tuple[list[str], list[list[str]]]:
    """(their texts in order, the second and third parts' prompt texts; an empty third part is left out)."""
    from decoding.train.prompt_pool import more_varied_prompts, passage, varied_prompts

    train_seqs, _ = split_sequences(len(data.offsets) - 1, settings.heldout_every)
    passages = [p for p in (passage(lm.decode(data.answer(s))) for s in train_seqs) if p is not None]
    second = varied_prompts(settings.n_varied, passages, settings.seed)
    third = (more_varied_prompts(settings.n_extra, settings.n_varied, passages, settings.seed)
             if settings.n_extra else [])
    return second + third, [part for part in (second, third) if part]


def _training_chats(lm, data: DistillData, texts: Sequence[str], every: int) -> list[tuple[str, str]]:
    """(question, the target's answer as text) for every training sequence with a non-empty answer."""
    train, _ = data_split(data, every)
    chats = []
    for s in train:
        answer = data.answer(s)
        while answer and answer[-1] in lm.eos_ids:
            answer = answer[:-1]
        text = lm.decode(answer).strip()
        if text:
            chats.append((texts[s], text))
    return chats


def _follow_up_parts(lm, chats: Sequence[tuple[str, str]], n: int, seed: int) -> list[list[list[int]]]:
    """The first n follow-up conversations as token ids, in parts of FOLLOW_UP_PART (the last may be short)."""
    from decoding.train.prompt_pool import follow_up_chats

    convs = follow_up_chats(chats, seed)
    check(n <= len(convs), "n_follow_up", n, f"must be at most {len(convs)} (the conversations these parts allow)")
    ids = [lm.encode_chat(conv) for conv in convs[:n]]
    return [ids[i:i + FOLLOW_UP_PART] for i in range(0, n, FOLLOW_UP_PART)]


def vocab_slice(data: DistillData, lm, vocab: str) -> list[int] | None:
    if vocab == "full":
        return None
    seen = set(data.tokens.tolist()) | set(lm.eos_ids)
    return sorted(t for t in seen if 0 <= t < lm.vocab_size)
