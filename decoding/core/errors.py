"""One error type for bad input: a one-line message naming the parameter and the bad value."""
import math
from numbers import Real


class ConfigError(ValueError):
    """Raised for any invalid user input; `str(err)` is the one-line message to show."""

    def __init__(self, param: str, value, expected: str):
        self.param, self.value, self.expected = param, value, expected
        super().__init__(f"{param}={value!r} is invalid: {expected}")

    @classmethod
    def from_line(cls, line: str) -> "ConfigError":
        """Rebuild from a message already formatted (e.g. one kept in a trace's `error`)."""
        err = cls.__new__(cls)
        ValueError.__init__(err, line)
        err.param, err.value, err.expected = line.split("=", 1)[0], None, line
        return err


def check(ok: bool, param: str, value, expected: str) -> None:
    """Raise ConfigError(param, value, expected) unless `ok`."""
    if not ok:
        raise ConfigError(param, value, expected)


def check_number(param: str, value, low: float, *, above: bool = False, below: float = math.inf) -> None:
    """`value` a finite real number >= `low` (> `low` when `above`) and < `below`; else ConfigError."""
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if above else value >= low) and value < below
    bound = f"> {low:g}" if above else f">= {low:g}"
    check(ok, param, value, f"must be a finite number {bound}" if below == math.inf
          else f"must be a finite number {bound} and < {below:g}")


class StepError(RuntimeError):
    """A run that cannot go on (e.g. the model produced NaN logits). The runner adds the step number:
    `line(step)` is the one-line message, "logits: NaN at step 3 (...)"."""

    def __init__(self, param: str, value: str, detail: str):
        self.param, self.value, self.detail = param, value, detail
        super().__init__(self.line(None))

    def line(self, step: int | None) -> str:
        where = f" at step {step}" if step is not None else ""
        return f"{self.param}: {self.value}{where} {self.detail}"
