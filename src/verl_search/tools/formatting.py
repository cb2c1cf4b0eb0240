"""Turn retrieved documents into the observation text the model reads.

The format is Search-R1's (`search_r1/llm_agent/generation.py`, `_passages2string`), plain text,
one line per passage, the title line kept as it is in the corpus (with its quotes)::

    Doc 1(Title: "Paris") Paris is the capital and most populous city of France.
    Doc 2(Title: "France") ...

Several queries in one call get a header each and are separated by a `---` line. Length limits
are in characters and never cut a passage in the middle of the observation: passages that do not
fit are left out whole, and the text says how many were left out.
"""

from __future__ import annotations

from verl_search.agent_protocol.tokens import observation_tokens
from verl_search.agent_protocol.vocabulary import NO_PASSAGES


def format_passage(index: int, document: dict, max_chars: int | None = None, show_id: bool = False) -> str:
    """`Doc {index}(Title: {title}) {text}`; the text is cut to `max_chars` characters (then `...`).
    With `show_id`, `Doc {index}(Title: {title}, id: {id}) {text}`: what the `access` tool reads a
    page by (on the web backend the id is the page's URL).

    >>> format_passage(1, {"id": "7", "contents": '"Paris"\\nCapital of France.'})
    'Doc 1(Title: "Paris") Capital of France.'
    >>> format_passage(1, {"id": "https://x.org/Paris", "contents": '"Paris"\\nCapital.'}, show_id=True)
    'Doc 1(Title: "Paris", id: https://x.org/Paris) Capital.'
    """
    contents = document.get("contents", "")
    title, _, text = contents.partition("\n")
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars].rstrip() + "..."
    shown = f", id: {document.get('id', '')}" if show_id else ""
    return f"Doc {index}(Title: {title}{shown}) {text}"


def format_results(
    queries: list[str],
    hits: list[list[dict]],
    max_chars_per_passage: int | None = None,
    max_observation_chars: int | None = None,
    show_ids: bool = False,
) -> tuple[str, bool]:
    """Format the documents of one search call.

    Args:
        queries: the queries, in order (headers are only written for two or more).
        hits: `hits[i]` the documents (`{"id", "contents"}`) of `queries[i]`.
        max_chars_per_passage: cut each passage's text to this many characters (None: no cut).
        max_observation_chars: total budget in characters; whole passages beyond it are left out
            and a closing line says so (None: no budget).
        show_ids: write each passage's id after its title (see `format_passage`).

    Returns:
        `(text, truncated)`.
    """
    blocks = []
    for query, documents in zip(queries, hits):
        lines = [f'Results for "{query}":'] if len(queries) > 1 else []
        lines += [format_passage(i + 1, doc, max_chars_per_passage, show_ids) for i, doc in enumerate(documents)]
        if not documents:
            lines.append(NO_PASSAGES)
        blocks.append("\n".join(lines))
    text = "\n---\n".join(blocks)
    if max_observation_chars is None or len(text) <= max_observation_chars:
        return text, False

    # Keep whole lines (passages) in order while they fit, leaving room for the closing note.
    budget = max_observation_chars - len(_truncation_note(10**6))
    kept, used, total_passages, kept_passages = [], 0, 0, 0
    for line in text.split("\n"):
        is_passage = line.startswith("Doc ")
        total_passages += is_passage
        if used + len(line) + 1 > budget or (is_passage and kept_passages < total_passages - 1):
            continue
        kept.append(line)
        used += len(line) + 1
        kept_passages += is_passage
    while kept and not kept[-1].startswith("Doc "):  # no dangling header or separator
        kept.pop()
    return "\n".join(kept) + _truncation_note(total_passages - kept_passages), True


def _truncation_note(dropped: int) -> str:
    return f"\n[truncated: {dropped} more passage{'s' if dropped != 1 else ''} not shown]"


def information_tokens(query: str, documents: list[dict], encode, max_tokens: int, notice: str = "",
                       max_chars_per_passage: int | None = None) -> tuple[list[int], bool]:
    """The Search-R1 observation of one search, as token ids: `documents` (`{"id", "contents"}`, the
    retriever's top-k for `query`) in `format_results`' text inside `\\n\\n<information>...</information>\\n\\n`,
    `notice` before the closing tag, at most `max_tokens` (`agent_protocol.tokens.observation_tokens`: the body cut by
    tokens, the frame kept). What `SearchR1AgentLoop` appends after a search and what the cold start's
    trajectories hold (`training.trajectories.trajectory_tokens`): one function, both callers.

    Returns:
        `(token_ids, truncated)`; `token_ids` is empty when even the frame does not fit.
    """
    body = format_results([query], [documents], max_chars_per_passage)[0]
    return observation_tokens(body, encode, max_tokens, notice)
