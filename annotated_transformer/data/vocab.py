"""`Vocab`: the token <-> id table of one language (or of a joint subword model).

The four specials sit at the ids the notebook gave them, so checkpoints, decoding and the
loss agree on them without looking anything up:

    0 <s>   start of sentence (BOS)        2 <blank>  padding (PAD)
    1 </s>  end of sentence (EOS)          3 <unk>    any token not in the vocabulary (UNK)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

SPECIALS = ("<s>", "</s>", "<blank>", "<unk>")
BOS, EOS, PAD, UNK = 0, 1, 2, 3


class Vocab:
    """An ordered list of tokens; a token's id is its position. Unknown tokens map to `<unk>`."""

    def __init__(self, itos: Sequence[str]) -> None:
        itos = list(itos)
        if tuple(itos[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with the specials {SPECIALS}, got {itos[:4]}")
        if len(set(itos)) != len(itos):
            raise ValueError("a vocabulary must not list a token twice")
        self.itos = itos
        self.stoi = {token: i for i, token in enumerate(itos)}

    @classmethod
    def build(cls, token_lists: Iterable[list[str]], min_freq: int = 2) -> Vocab:
        """Count tokens; keep those seen at least `min_freq` times, most frequent first, ties alphabetical."""
        return cls.from_counts(Counter(token for tokens in token_lists for token in tokens), min_freq)

    @classmethod
    def from_counts(cls, counts: Mapping[str, int], min_freq: int = 2) -> Vocab:
        """`build` from counts already made (token -> occurrences), as a corpus streamed in chunks gives them."""
        # A literal '<unk>' in the text must not become a second entry.
        kept = sorted((t for t, c in counts.items() if c >= min_freq and t not in SPECIALS),
                      key=lambda t: (-counts[t], t))
        return cls([*SPECIALS, *kept])

    def __len__(self) -> int:
        return len(self.itos)

    def __getitem__(self, token: str) -> int:
        """The id of `token`, or UNK."""
        return self.stoi.get(token, UNK)

    def __contains__(self, token: object) -> bool:
        return token in self.stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.itos == other.itos

    def __hash__(self) -> int:  # pragma: no cover - vocabularies are not used as keys
        return hash(tuple(self.itos))

    def __repr__(self) -> str:
        return f"Vocab({len(self)} tokens)"

    def lookup_indices(self, tokens: Iterable[str]) -> list[int]:
        """Ids of `tokens` (UNK for unknown ones)."""
        get = self.stoi.get
        return [get(t, UNK) for t in tokens]

    def lookup_token(self, index: int) -> str:
        """The token of one id; an id outside the table reads as `<unk>`."""
        index = int(index)
        return self.itos[index] if 0 <= index < len(self.itos) else SPECIALS[UNK]

    def lookup_tokens(self, ids: Iterable[int]) -> list[str]:
        """Tokens of `ids` (accepts ints, numpy integers, or a 1-D tensor)."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return [self.lookup_token(i) for i in ids]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form: {'itos': [token, ...]}."""
        return {"itos": list(self.itos)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Vocab:
        """Rebuild from `to_dict` output."""
        return cls(d["itos"])
