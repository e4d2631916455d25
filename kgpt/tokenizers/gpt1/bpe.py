"""GPT-1's byte-pair encoding of one word, exactly as the original: lowest-rank merge first.

BPE runs over a word's characters with `</w>` on the last one; every
occurrence of the lowest-rank known pair is merged, left to right, until no
pair is known. `bpe_short` is the original's loop; `bpe_long` gives the same
symbols in O(n log n) for long words.
"""

import heapq
import itertools

_UNKNOWN = float("inf")  # the rank of a pair no merge makes


def bpe_short(word, ranks, merges):
    """The original's BPE: merge every occurrence of the lowest-rank pair, left to right, until none is known."""
    symbols = list(word[:-1]) + [word[-1] + "</w>"]
    found = list(map(ranks.get, zip(symbols, symbols[1:]), itertools.repeat(_UNKNOWN)))  # rank of each pair
    while found:
        rank = min(found)
        if rank == _UNKNOWN:
            break
        first, second = merges[rank]
        merged = first + second
        i = found.index(rank)
        while True:
            symbols[i : i + 2] = [merged]
            del found[i]
            if i > 0:
                found[i - 1] = ranks.get((symbols[i - 1], merged), _UNKNOWN)
            if i < len(found):  # also hides an overlapping occurrence: "a a a" -> "aa a"
                found[i] = ranks.get((merged, symbols[i + 1]), _UNKNOWN)
            try:
                i = found.index(rank, i + 1)
            except ValueError:
                break
    return symbols


def bpe_long(word, ranks, merges):
    """The same result as `bpe_short` in O(n log n): a heap of pairs over a linked list of symbols.

    All occurrences of one pair are merged in one left-to-right pass before
    the pairs they create are queued, as the original's loop does.
    """
    symbols = list(word[:-1]) + [word[-1] + "</w>"]
    after = list(range(1, len(symbols))) + [-1]
    before = list(range(-1, len(symbols) - 1))
    heap = [(ranks[p], i) for i, p in enumerate(zip(symbols, symbols[1:])) if p in ranks]
    heapq.heapify(heap)
    while heap:
        rank = heap[0][0]
        first, second = merges[rank]
        merged = []
        while heap and heap[0][0] == rank:  # pops in position order: left to right
            i = heapq.heappop(heap)[1]
            j = after[i]
            if symbols[i] != first or j < 0 or symbols[j] != second:
                continue  # stale, or taken by the merge just left of it
            symbols[i], symbols[j] = first + second, None
            after[i] = after[j]
            if after[j] >= 0:
                before[after[j]] = i
            merged.append(i)
        for i in merged:
            for left, right in ((before[i], i), (i, after[i])):
                pair = (symbols[left], symbols[right]) if left >= 0 and right >= 0 else None
                if pair in ranks:
                    heapq.heappush(heap, (ranks[pair], left))
    return [s for s in symbols if s is not None]
