"""A step-through run that survives Streamlit reruns: the recorded events plus the engine's
generator, kept together in session state. Pure (no streamlit).

Why keep the generator: each Step then costs one engine step. A generator is only advanced between
reruns, never across one (Streamlit stops a script at its own calls, which are outside next()), so it
stays consistent. If it is ever missing (a fresh object, a failed step) it is rebuilt exactly by
re-running the engine with `forced=` the tokens so far and skipping the recorded steps: forced tokens
still run the choice rule, so the random draws stay aligned with the original run.

On a shared server a run lets go of what it holds when its session has been idle for IDLE_S
(`release_idle`, called whenever a page of any session asks for its model): the generator (its KV cache)
always, the model and the draft model too when it was given `reload` to get them back. Its steps stay;
the next Step reloads and rebuilds the generator as above (as long as the run so far took), so nothing
the page shows changes. `release_where` does the same for runs its caller picks (ui.widgets.session: those
holding a model copy the server's cache has dropped); a run in the middle of a step is never released.
"""
from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Sequence

from decoding.core.config import BaseConfig
from decoding.core.errors import ConfigError, check
from decoding.core.trace import Trace
from decoding.core.trace_totals import emitted_ids
from ui.widgets import engine

PER_TOKEN = ("greedy", "sample")   # one event per token, a forced prefix included
IDLE_S = 600.0                     # a run untouched this long lets go of its generator and model (release_idle)
_RUNS: weakref.WeakSet = weakref.WeakSet()   # every LiveRun alive, in any session (gone with its session)
_RUNS_LOCK = threading.Lock()

Reload = Callable[[], tuple[object, dict]]   # () -> (lm, strategy kwargs): the run's model, from the cache


class LiveRun:
    def __init__(self, lm, prompt_ids: Sequence[int], config: BaseConfig, *, prompt_text: str = "",
                 forced: Sequence[int] = (), strategy_kwargs: dict | None = None, reload: Reload | None = None):
        self._lm = lm
        self._kwargs = dict(strategy_kwargs or {})   # e.g. speculative's drafter=
        self._reload = reload
        self.touched = time.monotonic()
        self.prompt_ids = tuple(int(t) for t in prompt_ids)
        self.prompt_text = prompt_text
        self.config = config
        self.forced = tuple(int(t) for t in forced)
        self.events: list = []
        self.done = False
        self.stop_reason = "max_new_tokens"
        self.error: str | None = None
        self._gen = None
        self._stepping = threading.RLock()        # held while a step runs: release_where waits for none
        with _RUNS_LOCK:
            _RUNS.add(self)

    # ------------------------------------------------------------------ what it holds
    @property
    def lm(self):
        lm = self._lm
        if lm is None:
            lm, kwargs = self._reload()
            self._lm, self._kwargs = lm, dict(kwargs)
        return lm

    @property
    def strategy_kwargs(self) -> dict:
        self.lm                              # noqa: B018  (reloaded with the model when released)
        return self._kwargs

    def rebind(self, lm, strategy_kwargs: Callable[[], dict]) -> None:
        """Go on with `lm`, the cache's copy of this run's model, when the run holds another (its copy was
        dropped from the cache and loaded again): the generator is rebuilt on it at the next step, and the
        old copy is no longer held here. Marks the run as in use."""
        self.touched = time.monotonic()
        if self._lm is not None and self._lm is not lm:
            self._lm, self._kwargs, self._gen = lm, dict(strategy_kwargs()), None

    def release(self) -> None:
        """Drop the generator, and the model with the draft model when they can be reloaded."""
        self._gen = None
        if self._reload is not None:
            self._lm, self._kwargs = None, {}

    def holds(self) -> bool:
        """Whether the run holds a generator or a model (False once released)."""
        return self._gen is not None or (self._reload is not None and self._lm is not None)

    def models(self) -> list:
        """The model and draft model that releasing this run lets go of (none once released, none without
        `reload`: such a run keeps its model)."""
        if self._reload is None:
            return []
        return [m for m in (self._lm, *self._kwargs.values()) if m is not None]

    # ------------------------------------------------------------------ stepping
    def _generator(self):
        if self._gen is None:
            self._gen = engine.iterate(self.lm, self.prompt_ids, self.config, forced=self.forced,
                                       **self.strategy_kwargs)
            for _ in range(len(self.events)):   # rebuild: replay the recorded steps
                next(self._gen)
        return self._gen

    def step(self, n: int = 1, on_event: Callable[[object], None] | None = None) -> int:
        """Advance up to n events; return how many were added. Errors end the run with a message."""
        with self._stepping:
            return self._step(n, on_event)

    def _step(self, n: int, on_event: Callable[[object], None] | None) -> int:
        added = 0
        self.touched = time.monotonic()
        while added < n and not self.done:
            try:
                event = next(self._generator())
            except StopIteration:
                self.done, self._gen = True, None
                break
            except engine.RUN_ERRORS as err:
                self.done, self._gen = True, None
                self.stop_reason, self.error = "error", engine.error_line(err, self.config, len(self.events))
                break
            self.events.append(event)
            added += 1
            self._check_natural_end(event)
            if on_event is not None:
                on_event(event)   # may raise Streamlit's rerun/stop: the event is already recorded
        return added

    def _check_natural_end(self, event) -> None:
        """Mark the run done as soon as its last token is EOS or the token budget is spent (so the UI
        knows without asking the generator for one more step). Events that say when the search ends
        (beam search: `done`) are taken at their word."""
        if hasattr(event, "done"):
            if event.done:
                self.done, self._gen = True, None
            return
        out = self.output_ids
        if out and (out[-1] in self.lm.eos_ids or len(out) >= self.config.max_new_tokens):
            self.done, self._gen = True, None

    def run_to_end(self, on_event: Callable[[object], None] | None = None) -> int:
        return self.step(self.config.max_new_tokens + 1, on_event)

    @property
    def output_ids(self) -> list[int]:
        return [int(t) for t in engine.strategy_for(self.config).output_ids(self.events)]

    # ------------------------------------------------------------------ branching
    def branch(self, at: int, token_id: int) -> LiveRun:
        """A new run identical to this one for steps [0, at) that emits `token_id` at step `at`
        (forced) and continues from there (strategies whose events emit tokens in order)."""
        self._check_step(at)
        return self.fork(at, [int(t) for t in emitted_ids(self.events[:at])] + [int(token_id)])

    def fork(self, at: int, forced: Sequence[int]) -> LiveRun:
        """A branch departing at recorded event `at`: a run of the same settings that emits `forced`
        (every token after the prompt, up to and including the chosen one; ui.widgets.forcing computes it per
        strategy), then continues. Per-token strategies keep this run's events [0, at): the engine
        re-creates a forced prefix one step per token, so they are the same steps. The others start
        afresh, their first event emitting the forced tokens. Steps until all of them are out."""
        self._check_step(at)
        forced = [int(t) for t in forced]
        check(len(forced) > 0, "forced_ids", forced, "must name at least one token")
        prefix = self.events[:at]
        keep = at if self._per_token() and [int(t) for t in emitted_ids(prefix)] == forced[:at] else 0
        other = LiveRun(self.lm, self.prompt_ids, self.config, prompt_text=self.prompt_text, forced=forced,
                        strategy_kwargs=self.strategy_kwargs, reload=self._reload)
        other.events = list(prefix[:keep])
        while len(other.output_ids) < len(forced) and not other.done:
            if other.step(1) == 0:
                break
        return other

    def extend_to(self, reach: int) -> None:
        """Step until this run covers `reach` new-token positions (see `reach`) or ends."""
        while self.reach < reach and not self.done:
            if self.step(1) == 0:
                break

    @property
    def reach(self) -> int:
        """New-token positions covered: the output's length; for beam search the forced prefix plus
        one position per step (its output, the best hypothesis so far, may be shorter)."""
        if self.events and getattr(self.events[-1], "kind", "") == "beam":
            return len(self.forced) + len(self.events)
        return len(self.output_ids)

    def _per_token(self) -> bool:
        return self.config.strategy in PER_TOKEN

    def _check_step(self, at: int) -> None:
        if not 0 <= at < len(self.events):
            raise ConfigError("step", at, f"must be a recorded step in [0, {len(self.events)})")

    # ------------------------------------------------------------------ trace
    def trace(self) -> Trace:
        """The run so far as a Trace; wall time is the sum of the steps' measured timings."""
        wall_ms = sum(sum(e.timings_ms.values()) for e in self.events)
        stop = self.stop_reason if self.done else "stopped"
        if self.done and stop == "max_new_tokens" and not self.events:
            stop = "stopped"
        return engine.assemble(self.lm, self.prompt_ids, self.config, self.events, prompt_text=self.prompt_text,
                               forced=self.forced, end=engine.RunEnd(wall_ms / 1000.0, stop, self.error))


def release_idle(idle_s: float = IDLE_S, now: float | None = None) -> int:
    """Release every live run (of any session) untouched for `idle_s` seconds; how many were released."""
    now = time.monotonic() if now is None else now
    return release_where(lambda run: now - run.touched >= idle_s)


def release_where(pick: Callable[[LiveRun], bool]) -> int:
    """Release every live run (of any session, a closed tab's kept by Streamlit too) that `pick` chooses and
    that holds something, skipping runs in the middle of a step; how many were released."""
    with _RUNS_LOCK:
        runs = list(_RUNS)
    released = 0
    for run in runs:
        if not run._stepping.acquire(blocking=False):      # stepping now (another session's thread)
            continue
        try:
            if run.holds() and pick(run):
                run.release()
                released += 1
        finally:
            run._stepping.release()
    return released


def live_runs() -> int:
    """LiveRuns alive in this process (sessions closed and freed by Streamlit no longer count)."""
    with _RUNS_LOCK:
        return len(_RUNS)
