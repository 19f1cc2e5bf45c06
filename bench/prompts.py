"""The benchmark prompt set: chat, summarization of a given text, code. Kept here so every benchmark
uses the same prompts; none of them is used to train the shipped drafters."""

SUMMARY_SOURCE = (
    "The city council met on Tuesday to discuss the new bicycle lanes planned for the river road. "
    "Supporters said the lanes would make the commute safer for students and reduce traffic near the "
    "bridge. Shop owners worried that removing parking spaces would keep customers away during the "
    "building work, which is expected to last four months. The council agreed to publish a detailed "
    "plan next month and to hold a public meeting before any work begins."
)

PROMPTS = {
    "chat": "What are three good habits for staying healthy while working from home?",
    "summary": "Summarize the following text in two sentences.\n\n" + SUMMARY_SOURCE,
    "code": "Write a Python function that checks whether a string is a palindrome, with a docstring.",
}

# Written for the DSpark head-to-head (python -m bench dspark-head) and never used in training: each
# differs from every prompt of decoding.train.data.distill_prompts and decoding.train.prompt_pool
# (tests/test_bench_prompts.py checks that no training prompt shares a sentence with them).
FRESH_PROMPTS = {
    "gears": "Describe how a bicycle's gears make it easier to ride up a hill.",
    "email": "Write a short, polite email asking a landlord to fix a leaking kitchen tap.",
    "tea": "List the steps to make a cup of green tea, and say why the water should not be boiling.",
    "vowels": "Write a Python function that counts the vowels in a string, with a short comment on each line.",
    "passive": "Rewrite this sentence in the passive voice: The committee approved the new library budget after a "
               "long debate.",
    "sunset": "Explain to a ten-year-old why the sky turns red at sunset.",
    "museum": "Summarize in one sentence: The museum will close its east wing for three weeks in March while workers "
              "replace the old heating system. Visitors can still see the main collection, and tickets bought for "
              "the closed rooms will be refunded.",
}
