"""Page access over a corpus: a passage by its id, a whole page (every passage of one title) by title.

The wiki-18 corpus (Search-R1 / FlashRAG) splits each Wikipedia article into 100-word passages
that share the article's title line, in article order. After a search shows an agent a snippet, it
can read the passage whole (by id) or the article it came from (by title), as ASearcher's `access`
tool does with URLs (`tools/local_retrieval_server.py`, `POST /access`).

`PageLookup` keeps two sorted tables of 64-bit hashes (BLAKE2b) with their corpus rows: one of the
normalised titles and, only when some passage's id is not its row number, one of the ids. 16 bytes
per passage and table (wiki-18's 21M passages: about 340 MB for the titles), never the corpus as
Python objects; a hash match is confirmed against the passage itself. Building the tables reads the
whole corpus once (wiki-18: minutes); `PageLookup.open` caches them under `$VERL_SEARCH_CACHE`,
keyed by the corpus path, size and modification time, as the loader caches offset tables.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from verl_search.retrieval.base import Passage
from verl_search.retrieval.corpus import JsonlCorpus
from verl_search.runtime.env import read_env

logger = logging.getLogger(__name__)


def normalise_title(title: str) -> str:
    """The lookup form of a title: surrounding double quotes and spaces stripped, whitespace runs as
    one space, case folded.

    >>> normalise_title('  "The  Beatles" ')
    'the beatles'
    """
    return " ".join(title.strip().strip('"').split()).casefold()


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Page:
    """A page read by `PageLookup`: `passages` in corpus order (one for a lookup by id).

    Attributes:
        title: the title as in the corpus (without quotes).
        passages: the passages, best first: by id the one passage, by title every passage of it.
    """

    title: str
    passages: list[Passage] = field(default_factory=list)

    @property
    def id(self) -> str:
        """The id of the first passage."""
        return self.passages[0].id

    @property
    def contents(self) -> str:
        """`"Title"` on the first line, then each passage's text on a line of its own."""
        return "\n".join([f'"{self.title}"', *(p.text for p in self.passages)])


def _sorted_table(keys: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """`(sorted hashes, their rows)`; rows of equal hashes stay in corpus order."""
    hashes = np.asarray(keys, dtype=np.uint64)
    order = np.argsort(hashes, kind="stable")
    return hashes[order], order.astype(np.int64)


class PageLookup:
    """Passages by id and pages by title over a `JsonlCorpus`.

    Args:
        corpus: the corpus (row `i` is line `i`).
        titles: `(sorted title hashes, rows)` from `build_tables`.
        ids: `(sorted id hashes, rows)`, or None when every passage's id is its row number
            (wiki-18 and the mini corpus: `"0"`, `"1"`, ...), which then needs no table.
    """

    def __init__(self, corpus: JsonlCorpus, titles: tuple[np.ndarray, np.ndarray],
                 ids: tuple[np.ndarray, np.ndarray] | None = None):
        self.corpus, self._titles, self._ids = corpus, titles, ids

    @staticmethod
    def build_tables(corpus: JsonlCorpus) -> dict[str, np.ndarray]:
        """Read every passage once; return the arrays `title_hashes`, `title_rows` and, when some id is
        not its row number, `id_hashes`, `id_rows`."""
        title_keys, id_keys, ids_are_rows = [], [], True
        for row in range(len(corpus)):
            passage = corpus.get(row)
            title_keys.append(_hash(normalise_title(passage.title)))
            id_keys.append(_hash(passage.id))
            ids_are_rows = ids_are_rows and passage.id == str(row)
        tables = dict(zip(("title_hashes", "title_rows"), _sorted_table(title_keys)))
        if not ids_are_rows:
            tables.update(zip(("id_hashes", "id_rows"), _sorted_table(id_keys)))
        return tables

    @classmethod
    def from_tables(cls, corpus: JsonlCorpus, tables) -> "PageLookup":
        ids = (tables["id_hashes"], tables["id_rows"]) if "id_hashes" in tables else None
        return cls(corpus, (tables["title_hashes"], tables["title_rows"]), ids)

    @classmethod
    def open(cls, corpus: JsonlCorpus, cache: bool = True) -> "PageLookup":
        """The lookup of `corpus`, its tables read from the cache under `$VERL_SEARCH_CACHE` or built
        (then cached; a cache folder that cannot be written is logged and skipped)."""
        if not cache:
            return cls.from_tables(corpus, cls.build_tables(corpus))
        stat = corpus.path.stat()
        key = hashlib.sha256(f"{corpus.path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:24]
        cached = read_env().cache_dir / f"pages-{key}.npz"
        if cached.is_file():
            with np.load(cached) as stored:
                return cls.from_tables(corpus, dict(stored))
        logger.info("reading %s once to build its title table (cached in %s)", corpus.path, cached.parent)
        tables = cls.build_tables(corpus)
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            partial = Path(f"{cached}.tmp-{os.getpid()}.npz")
            np.savez(partial, **tables)
            os.replace(partial, cached)
        except OSError as exc:
            logger.warning("could not cache the title table in %s: %s", cached.parent, exc)
        return cls.from_tables(corpus, tables)

    @staticmethod
    def _rows(table: tuple[np.ndarray, np.ndarray], key: str) -> np.ndarray:
        hashes, rows = table
        wanted = np.uint64(_hash(key))
        return rows[np.searchsorted(hashes, wanted, "left"):np.searchsorted(hashes, wanted, "right")]

    def passage(self, passage_id: str) -> Passage | None:
        """The passage whose id is `passage_id`, or None."""
        if self._ids is None:
            row = int(passage_id) if passage_id.isdecimal() and passage_id == str(int(passage_id)) else -1
            return self.corpus.get(row) if 0 <= row < len(self.corpus) else None
        for row in self._rows(self._ids, passage_id):
            passage = self.corpus.get(int(row))
            if passage.id == passage_id:
                return passage
        return None

    def by_id(self, passage_id: str) -> Page | None:
        """The passage of `passage_id` as a one-passage `Page`, or None."""
        passage = self.passage(passage_id)
        return None if passage is None else Page(passage.title, [passage])

    def by_title(self, title: str) -> Page | None:
        """Every passage whose title is `title` (compared by `normalise_title`), in corpus order, or None."""
        wanted = normalise_title(title)
        if not wanted:
            return None
        passages = [p for p in (self.corpus.get(int(row)) for row in self._rows(self._titles, wanted))
                    if normalise_title(p.title) == wanted]
        return Page(passages[0].title, passages) if passages else None
