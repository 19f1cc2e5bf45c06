"""The Playground's one-click prompts: which kind of text each is and what drafting does on it. Pure data.
The copy, free-writing, list and fact prompts are the Tour's (ui/views/tour.py), so a stop's story can be
re-run from the Playground."""
from __future__ import annotations

from dataclasses import dataclass

from ui.views.tour import COPY_PROMPT, COPY_TEXT, POEM_PROMPT


@dataclass(frozen=True)
class Preset:
    name: str          # the button's label
    prompt: str
    hint: str          # what to expect, one line


SUMMARY_PROMPT = f'Summarize this text in one sentence: "{COPY_TEXT} The output is exactly what the large model '\
                 'would have written alone, only faster when the guesses are good."'

PRESETS: tuple[Preset, ...] = (
    Preset("Copy a text", COPY_PROMPT,
           "The answer repeats the prompt: prompt lookup and DSpark accept long runs of drafts "
           "(try speculative with draft lookup, or dspark)."),
    Preset("Summarize", SUMMARY_PROMPT,
           "The answer reuses the prompt's words: lookup finds matches, DSpark's rounds accept several tokens."),
    Preset("Free writing", POEM_PROMPT,
           "Nothing to copy: drafts are guesses, and many rounds accept little or nothing (the step panel "
           "says why)."),
    Preset("A list", "List the days of the week.",
           "A predictable answer: the target is confident, so greedy and sampling mostly agree."),
    Preset("A fact", "What is the capital of France?",
           "A short answer: try beam search against greedy."),
)


def preset_for(prompt: str) -> Preset | None:
    """The preset whose prompt this is, if any."""
    return next((p for p in PRESETS if p.prompt == prompt), None)
