"""An incremental suffix index over a growing token list: the most recent earlier occurrence of the list's
current suffix, and what followed it.

Hand-written: one dict per n-gram length mapping the n-gram to the position right after its most recent
occurrence is ~30 lines, costs O(lengths) dict updates per appended token and never rescans the history; the
suffix-decoding libraries (ArcticInference's suffix tree) are vLLM plugins with C++ extensions, not a
dependency a CPU lab should take for this.
"""

from __future__ import annotations

from collections.abc import Sequence


class SuffixIndex:
    """n-gram -> position of the token that followed its most recent occurrence, for n in [shortest, longest].

    Only n-grams that have a follower are indexed, so the current suffix (which has none yet) finds an
    earlier occurrence, never itself.
    """

    def __init__(self, shortest: int, longest: int):
        if not 1 <= shortest <= longest:
            raise ValueError(f"need 1 <= shortest <= longest, got {shortest}, {longest}")
        self.shortest, self.longest = shortest, longest
        self.tokens: list[int] = []
        self._after: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(shortest, longest + 1)}

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens; each one becomes the follower of the n-grams that end just before it."""
        for t in tokens:
            i = len(self.tokens)
            for n in range(self.shortest, min(self.longest, i) + 1):
                self._after[n][tuple(self.tokens[i - n:i])] = i
            self.tokens.append(int(t))

    def sync(self, prefix: Sequence[int]) -> None:
        """Index what `prefix` adds to the tokens seen so far. A decode's prefix only grows (committed tokens never
        change); a prefix that does not extend them is indexed anew rather than trusted."""
        seen = len(self.tokens)
        if len(prefix) < seen or (seen and prefix[seen - 1] != self.tokens[-1]):
            self.__init__(self.shortest, self.longest)
            seen = 0
        self.extend(prefix[seen:])

    def match(self) -> tuple[int, int] | None:
        """(n, follower position) of the longest suffix of length >= shortest seen before (its most recent
        occurrence), or None."""
        L = len(self.tokens)
        for n in range(min(self.longest, L), self.shortest - 1, -1):
            pos = self._after[n].get(tuple(self.tokens[L - n:]))
            if pos is not None:
                return n, pos
        return None

    def continuation(self, pos: int, k: int) -> list[int]:
        """k tokens from `pos` on; past the end the text is taken to repeat with period len - pos (the match says
        the suffix recurs after that many tokens), so the proposal is always k long."""
        L, out = len(self.tokens), []
        for j in range(k):
            i = pos + j
            out.append(self.tokens[i] if i < L else out[i - L])
        return out
