"""The Lab's cost curve as a table (scripts/gpu_check.sh --real): the device's measured bandwidth and FLOP
rate, then a forward's time over n new tokens (one sequence) and over b sequences (one new token each)
against the least time those rates allow (the roofline), as the Lab page draws them.

    python -m bench.lab_cost [--device cuda --dtype bfloat16 --fast-path --md FILE]
"""
from __future__ import annotations

import argparse

from bench import model_options
from bench.report import machine
from decoding.core.measures import CostConfig, DeviceRates, ForwardTime
from decoding.core.roofline import ModelShape, bound_by, forward_bytes, forward_flops, roofline_ms
from decoding.lab.forward_cost import measure_cost


def rows(shape: ModelShape, rates: DeviceRates, times: list[ForwardTime], cached: int) -> list[str]:
    out = ["| axis | n | ms (median) | roofline ms | × roofline | bound by |", "|---|---:|---:|---:|---:|---|"]
    for t in times:
        tokens, batch = (t.n, 1) if t.axis == "tokens" else (1, t.n)
        flops = forward_flops(shape, tokens, cached, batch)
        read = forward_bytes(shape, tokens, cached, batch)
        least = roofline_ms(flops, read, rates.flops_per_s, rates.bytes_per_s)
        out.append(f"| {t.axis} | {t.n} | {t.ms:.2f} | {least:.3f} | {t.ms / least:.1f} | "
                   f"{bound_by(flops, read, rates.flops_per_s, rates.bytes_per_s)} |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lab_cost", description=__doc__.splitlines()[0])
    model_options.add(parser)
    args = parser.parse_args(argv)
    lm = model_options.load_model(args)
    config = CostConfig()
    shape, rates, times = None, None, []
    for point in measure_cost(lm, config):
        if isinstance(point, ModelShape):
            shape = point
        elif isinstance(point, DeviceRates):
            rates = point
        else:
            times.append(point)
    body = ["## The Lab's cost curve", "",
            f"Command: `python -m bench.lab_cost{model_options.flags(args)}`  ",
            f"Model: {model_options.label(lm)}; machine: {machine()}.  ",
            f"Device rates: {rates.bytes_per_s / 1e9:.0f} GB/s read, {rates.flops_per_s / 1e12:.2f} TFLOP/s "
            f"({rates.product}). Every forward after a cached prefix of {config.prefix_tokens} tokens; median of "
            f"{config.repeats}.", ""] + rows(shape, rates, times, config.prefix_tokens)
    text = "\n".join(body)
    if args.md is not None:
        model_options.write(args, "lab_cost", text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
