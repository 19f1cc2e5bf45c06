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
