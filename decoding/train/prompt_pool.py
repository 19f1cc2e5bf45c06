"""Varied distillation prompts: the second prompt pool of the self-distillation data.

The first pool (decoding.train.data.distill_prompts) is 16 templates x 67 topics; drafters trained on it alone
learn those templates' phrasing and accept far less on prompts phrased otherwise. This pool mixes four
families phrased in many ways:
  * text tasks: summarise / rewrite / extract / title / question a given passage; the passages are the
    target's own answers from the first pool (training sequences only), so no text is written here;
  * advice and how-to questions over everyday goals;
  * code tasks in several languages with different requests (docstring, comments, tests, explanation);
  * other writing: comparisons, definitions, emails, plans, dialogues, opinions.
None of the benchmark prompts (bench/prompts.py) is in it, nor any of their exact tasks."""
from __future__ import annotations

import random
from collections.abc import Sequence

from decoding.core.errors import ConfigError, check

_TEXT_TASKS = (
    "Summarize the following text in one sentence.\n\n{x}",
    "Summarize the following text in two sentences.\n\n{x}",
    "Write a short summary of this passage for a busy reader:\n\n{x}",
    "What are the key points of the text below? Answer as a bulleted list.\n\n{x}",
    "Rewrite the following paragraph so that a ten-year-old can understand it.\n\n{x}",
    "Rewrite this text in a more formal tone:\n\n{x}",
    "Suggest a good title for the following text.\n\n{x}",
    "Read the passage and write two questions a teacher could ask about it.\n\n{x}",
    "Text:\n{x}\n\nWhat is the main idea of this text?",
    "Here is a paragraph:\n{x}\n\nShorten it to about half its length.",
    "Extract the three most important facts from this text:\n\n{x}",
    "Is the following text written for experts or beginners? Explain briefly.\n\n{x}",
)
_GOALS = (
    "sleep better", "save money on groceries", "learn a new language", "stay focused while studying",
    "keep a houseplant alive", "prepare for a job interview", "start running", "reduce stress at work",
    "make new friends in a new city", "cook healthy meals on a budget", "organize a small closet",
    "write a good cover letter", "get better at drawing", "remember what I read", "drink more water",
    "stop procrastinating", "plan a birthday party", "keep a journal", "learn to play the guitar",
    "travel with only a backpack", "prepare for an exam in a week", "keep my kitchen clean",
    "be more confident when speaking in meetings", "grow tomatoes on a balcony", "wake up earlier",
    "spend less time on my phone", "teach my dog to sit", "take better photos with my phone",
    "read more books this year", "stay warm in winter without high bills", "learn basic first aid",
    "give useful feedback to a colleague", "choose a good laptop", "keep my passwords safe",
    "save for a holiday", "improve my handwriting", "make a long car trip fun for children",
    "start a small vegetable garden", "write a clear email", "learn to swim as an adult",
    "keep in touch with old friends", "prepare a presentation", "eat less sugar", "fix a slow computer",
    "lower my electricity use", "learn touch typing", "choose a book for a book club", "bake bread at home",
    "get started with volunteering", "manage a small team",
)
_ADVICE = (
    "How can I {g}?", "What are some tips to {g}?", "Give me five practical ways to {g}.",
    "I want to {g}. Where should I start?", "What is the best way to {g}?",
    "I want to {g}, but I keep failing. What should I change?", "What mistakes do people make when they try to {g}?",
    "Make a one-week plan to help me {g}.",
)
_CODE_TASKS = (
    "returns the largest number in a list", "counts the vowels in a string", "removes duplicates from a list",
    "computes the factorial of a number", "checks whether a year is a leap year", "sorts a list of words by length",
    "converts Celsius to Fahrenheit", "returns the sum of the digits of an integer", "finds the second smallest number",
    "capitalizes the first letter of every word", "checks whether two strings are anagrams",
    "counts how often each word appears in a text", "flattens a nested list", "computes the average of a list",
    "returns the greatest common divisor of two numbers", "splits a list into chunks of size n",
    "checks whether a list is sorted", "reverses the order of words in a sentence", "validates an email address",
    "finds the longest word in a sentence", "rotates a list by k positions", "converts a binary string to an integer",
    "returns all even numbers from a list", "merges two dictionaries", "computes the power set of a small set",
    "implements binary search", "reads a CSV file and prints the number of rows", "generates a random password",
    "computes the median of a list", "transposes a matrix",
)
_LANGUAGES = ("Python", "Python", "JavaScript", "C", "Java", "Rust", "Go")
_CODE = (
    "Write a {lang} function that {c}.", "Write a {lang} function that {c}, with comments.",
    "In {lang}, how do I write a function that {c}?", "Write a {lang} function that {c} and explain how it works.",
    "Write a {lang} function that {c}. Include a short test.", "Show me a short {lang} program that {c}.",
)
_PAIRS = (
    ("a cat", "a dog as a pet"), ("trains", "planes for travel in Europe"), ("tea", "coffee"),
    ("renting", "buying a home"), ("e-books", "paper books"), ("running", "swimming for fitness"),
    ("a laptop", "a tablet for students"), ("weather", "climate"), ("a virus", "a bacterium"),
    ("RAM", "storage in a computer"), ("a lake", "a sea"), ("saving", "investing"), ("a comet", "an asteroid"),
    ("mitosis", "meiosis"), ("speed", "velocity"), ("a simile", "a metaphor"), ("HTTP", "HTTPS"),
    ("a republic", "a monarchy"), ("baking soda", "baking powder"), ("an alligator", "a crocodile"),
)
_TERMS = (
    "opportunity cost", "an ecosystem", "a neural network", "supply and demand", "a haiku", "entropy",
    "a recursive function", "osmosis", "a budget deficit", "a placebo", "irony", "a firewall", "erosion",
    "a sonnet", "latency", "a carbon footprint", "an algorithm", "a food chain", "a fraction", "a democracy",
)
_OTHER = (
    "What is the difference between {a} and {b}?", "Compare {a} and {b} in a short table.",
    "Which is better, {a} or {b}? Give arguments for both.",
)
_TERM_TASKS = (
    "Define {t} in one sentence.", "What does {t} mean? Give an example.", "Explain {t} using an analogy.",
    "Write a quiz question about {t}, with the answer.",
)
_WRITING = (
    "Write an email to my manager asking for a day off next Friday.",
    "Write a thank-you note to a neighbour who watered my plants.",
    "Write a short dialogue between a customer and a waiter.", "Write a limerick about a forgetful robot.",
    "Plan a three-day trip to a city by the sea.", "Write a product description for a reusable water bottle.",
    "Write a short speech for a friend's wedding.", "Describe a sunrise in the mountains in four sentences.",
    "Write an apology message for missing a meeting.", "Write a job advert for a part-time librarian.",
    "Write a recipe for a simple vegetable soup.", "Write the opening paragraph of a mystery novel.",
    "Invent a new board game and explain its rules.", "Write a motivational message for students before exams.",
    "Describe your ideal weekend.", "Write a review of an imaginary restaurant.",
    "Write a letter to your future self.", "Write a short fable with a moral.",
    "What questions should I ask when buying a used car?", "Explain how a bill becomes a law.",
    "Why is the sky blue?", "Why do leaves change colour in autumn?", "How does a refrigerator keep food cold?",
    "What causes the seasons?", "How do airplanes stay in the air?", "Why do we dream?",
    "What would a day on Mars be like?", "How does a search engine find web pages?",
    "Tell me a fun fact about the ocean.", "What should I pack for a camping trip?",
)
FAMILIES = ("text", "advice", "code", "other")
_FOLLOW_UPS = (
    "Can you make that shorter?", "Give me a concrete example.", "Explain that again in simpler words.",
    "Summarize your answer in one sentence.", "Rewrite your answer as a bulleted list.",
    "Which point is the most important, and why?", "Can you say more about the first point?",
    "Now say it in a more formal tone.", "Is there anything important you left out?",
    "Turn your answer into three quiz questions with their answers.", "Suggest a title for your answer.",
    "What would someone who disagrees say?", "How would you explain this to a complete beginner?",
    "Thanks! What is one thing I could do today with this?", "Can you check your answer for mistakes?",
    "Write that as a short paragraph without a list.",
)
_CODE_FOLLOW_UPS = (
    "Add type hints to it.", "Write two unit tests for it.", "Explain the code line by line.",
    "What is its time complexity?", "How should it handle invalid input?", "Can you make it shorter?",
    "Rewrite it without any library functions.", "Add a docstring and comments.",
    "Show an example of calling it and what it prints.", "What edge cases should I test?",
)


def _family(name: str, texts: Sequence[str], rng: random.Random) -> list[str]:
    """All prompts of one family; a text task gets one passage each, its instruction drawn by `rng`."""
    if name == "text":
        return [rng.choice(_TEXT_TASKS).format(x=x) for x in texts]
    if name == "advice":
        return [t.format(g=g) for g in _GOALS for t in _ADVICE]
    if name == "code":
        return [t.format(lang=lang, c=c) for c in _CODE_TASKS for lang in dict.fromkeys(_LANGUAGES) for t in _CODE]
    return ([t.format(a=a, b=b) for a, b in _PAIRS for t in _OTHER]
            + [t.format(t=term) for term in _TERMS for t in _TERM_TASKS] + list(_WRITING))


def varied_prompts(n: int, texts: Sequence[str], seed: int = 0) -> list[str]:
    """n distinct prompts taken in turn from the four families (a family that runs out leaves its turn
    to the others), each text-task prompt on its own passage; shuffled by `seed`."""
    rng = random.Random(seed)
    pools = {name: _family(name, texts, rng) for name in FAMILIES}
    for items in pools.values():
        rng.shuffle(items)
    total = sum(len(v) for v in pools.values())
    check(1 <= n <= total, "n_varied", n, f"must be in [1, {total}] (with {len(texts)} passages)")
    out, taken = [], dict.fromkeys(FAMILIES, 0)
    while len(out) < n:
        for name in FAMILIES:
            if len(out) < n and taken[name] < len(pools[name]):
                out.append(pools[name][taken[name]])
                taken[name] += 1
    rng.shuffle(out)
    return out


def more_varied_prompts(n: int, after: int, texts: Sequence[str], seed: int = 0) -> list[str]:
    """The n prompts that varied_prompts(after + n) adds to varied_prompts(after): distinct from those,
    so a data set can grow by a part of its own (each part cached alone) instead of regenerating."""
    check(n >= 1, "n_extra", n, "must be >= 1")
    try:
        grown = varied_prompts(after + n, texts, seed)
    except ConfigError:
        raise ConfigError("n_extra", n, f"the pool has fewer than {after + n} prompts for these "
                          f"{len(texts)} passages") from None
    first = set(varied_prompts(after, texts, seed))
    return [p for p in grown if p not in first]


def passage(text: str, max_chars: int = 420) -> str | None:
    """The leading sentences of an answer (at most max_chars, cut at a sentence end), or None when the
    answer is too short or code-like to make a passage."""
    text = " ".join(text.split())
    if len(text) < 120 or "```" in text or "def " in text:
        return None
    cut = text[:max_chars]
    end = max(cut.rfind(". "), cut.rfind("! "), cut.rfind("? "))
    if len(text) > max_chars and end > 100:
        cut = cut[:end + 1]
    return cut.strip()


def _is_code(question: str, answer: str) -> bool:
    return "```" in answer or "def " in answer or any(w in question for w in _CODE_WORDS)


_CODE_WORDS = ("function", "program", "SQL", "bash", "class ", "JavaScript", "Python")


def follow_up_chats(chats: Sequence[tuple[str, str]], seed: int = 0) -> list[tuple[str, str, str]]:
    """Two-turn conversations (question, the target's answer, a follow-up request): round r gives every
    chat, in an order shuffled per round, the r-th of its own shuffled follow-ups (code chats draw code
    follow-ups), so the first len(chats) conversations hold each chat once. A longer list starts with
    a shorter one: parts cut from it in order stay the same as the set grows."""
    rng = random.Random(seed)
    menus = []
    for question, answer in chats:
        menu = list(_CODE_FOLLOW_UPS if _is_code(question, answer) else _FOLLOW_UPS)
        rng.shuffle(menu)
        menus.append(menu)
    out = []
    for r in range(max((len(m) for m in menus), default=0)):
        order = [i for i in range(len(chats)) if r < len(menus[i])]
        rng.shuffle(order)
        out += [(*chats[i], menus[i][r]) for i in order]
    return out
