"""The feature drafter's loss for one drafting step, shared by its plain and attending trainers."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from decoding.drafters.feature_net import FeatureNet
from decoding.train.data import DistillData


def position_loss(net: FeatureNet, predicted: torch.Tensor, data: DistillData, rows: torch.Tensor,
                  valid: torch.Tensor, slice_of: torch.Tensor, settings) -> torch.Tensor:
    """One drafting step's loss, the mean over `valid` positions: predicted LM-head inputs (..., H)
    against the DistillData `rows` (...) they should produce: CE to the row's token + soft_weight × CE to
    its top-k + feature_weight × smooth-L1 to its LM-head input (tokens outside the slice do not count)."""
    logq = F.log_softmax(net.slice_logits(predicted), -1)                       # (..., V_s)
    label = slice_of[data.tokens[rows]]
    ok = (valid & (label >= 0)).float()
    hard = -logq.gather(-1, label.clamp(min=0)[..., None])[..., 0]
    soft_ids = slice_of[data.soft_ids[rows].long()]                             # (..., k)
    soft_p = data.soft_probs[rows].float() * (soft_ids >= 0)
    soft = -(logq.gather(-1, soft_ids.clamp(min=0)) * soft_p).sum(-1)
    regress = F.smooth_l1_loss(predicted, data.hidden[rows].float(), reduction="none").mean(-1)
    per = hard + settings.soft_weight * soft + settings.feature_weight * regress
    return (per * ok).sum() / ok.sum().clamp(min=1)
