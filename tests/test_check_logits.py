"""LM.check_logits: one cheap pass for finite logits, the exact diagnosis for the rest."""
from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_llama

from decoding.core.errors import StepError
from decoding.runtime.models import LM


@pytest.fixture(scope="module")
def lm():
    return LM(make_tiny_llama(), tokenizer=None, name="tiny")


def with_value(value: float, where=(1, 7), rows: int = 3) -> torch.Tensor:
    logits = torch.randn(rows, 64)
    logits[where] = value
    return logits


@pytest.mark.parametrize("logits", [torch.randn(3, 64), with_value(float("-inf")),
                                    torch.full((2, 64), 3e38)],          # finite, but the sum overflows
                         ids=["finite", "some -inf", "finite, sum overflows"])
def test_usable_logits_come_back_unchanged(lm, logits):
    assert lm.check_logits(logits) is logits


@pytest.mark.parametrize("logits, kind", [(with_value(float("nan")), "NaN"), (with_value(float("inf")), "+inf"),
                                          (with_value(float("-inf"), where=(2,)), "-inf everywhere")],
                         ids=["nan", "+inf", "-inf row"])
def test_unusable_logits_stop_the_run_naming_the_problem(lm, logits, kind):
    with pytest.raises(StepError) as err:
        lm.check_logits(logits)
    assert err.value.value == kind
