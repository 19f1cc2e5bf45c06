"""One error type for bad input: a one-line message naming the parameter and the bad value."""


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


class StepError(RuntimeError):
    """A run that cannot go on (e.g. the model produced NaN logits). The runner adds the step number:
    `line(step)` is the one-line message, "logits: NaN at step 3 (...)"."""

    def __init__(self, param: str, value: str, detail: str):
        self.param, self.value, self.detail = param, value, detail
        super().__init__(self.line(None))

    def line(self, step: int | None) -> str:
        where = f" at step {step}" if step is not None else ""
        return f"{self.param}: {self.value}{where} {self.detail}"
