"""Hooks on the target model: read its hidden states during a forward it runs anyway (no extra pass).
The drafters' input rows come from here."""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch
from torch import nn

from decoding.core.errors import check


class HeadInputTap:
    """Records what the target's LM head reads (B, T, H) during a forward (a pre-hook), and the outputs
    of the decoder layers listed in `feature_layers` (forward hooks); `hidden` is the drafter's input
    rows (B, T, H·(1 + len(feature_layers))), the LM-head input first."""

    def __init__(self, feature_layers: Sequence[int] = ()):
        self.feature_layers = tuple(feature_layers)
        self.head_input: torch.Tensor | None = None
        self.layer_outputs: dict[int, torch.Tensor] = {}

    def __call__(self, module, args):
        self.head_input = args[0].detach()

    def layer_hook(self, index: int):
        def hook(module, args, output):
            self.layer_outputs[index] = (output[0] if isinstance(output, tuple) else output).detach()
        return hook

    @property
    def hidden(self) -> torch.Tensor | None:
        if self.head_input is None or not self.feature_layers:
            return self.head_input
        device, t = self.head_input.device, self.head_input.shape[1]   # layers may sit on other devices
        # the head may read only the last t positions (logits_to_keep): the layers' rows for those
        outs = [self.layer_outputs[i][:, -t:].to(device) for i in self.feature_layers]
        return torch.cat([self.head_input] + outs, -1)


def decoder_layers(lm) -> nn.ModuleList:
    return lm.model.get_decoder().layers


def check_feature_layers(layers: Sequence[int], n_layers: int) -> None:
    """One-line error unless every feature layer is one of the model's `n_layers` decoder layers."""
    check(all(0 <= i < n_layers for i in layers), "feature_layers", list(layers),
          f"this model has {n_layers} decoder layers (indices 0..{n_layers - 1})")


@contextmanager
def tap_head_input(lm, feature_layers: Sequence[int] = ()):
    """with tap_head_input(lm) as tap: logits = lm.forward(...); tap.hidden -> (1, T, H), or with
    feature layers (1, T, H·(1 + E)): the drafter's input rows, captured from a forward run anyway."""
    tap = HeadInputTap(feature_layers)
    layers = decoder_layers(lm) if tap.feature_layers else ()
    check_feature_layers(tap.feature_layers, len(layers))
    with lm.lock:
        handles = [lm.model.get_output_embeddings().register_forward_pre_hook(tap)]
        handles += [layers[i].register_forward_hook(tap.layer_hook(i)) for i in tap.feature_layers]
        try:
            yield tap
        finally:
            for handle in handles:
                handle.remove()


class DecoderRowsTap:
    """Records the decoder's output (B, T, H): the LM-head input at every position a forward fed (the head
    itself may read only the last few, logits_to_keep)."""

    def __init__(self):
        self.rows: torch.Tensor | None = None

    def __call__(self, module, args, output):
        self.rows = (output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]).detach()


@contextmanager
def tap_decoder_rows(lm):
    """with tap_decoder_rows(lm) as tap: logits = lm.forward(...); tap.rows -> (1, T, H)."""
    tap = DecoderRowsTap()
    with lm.lock:
        handle = lm.model.get_decoder().register_forward_hook(tap)
        try:
            yield tap
        finally:
            handle.remove()
