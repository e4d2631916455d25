"""The paper's input transformations (section 3.3, Figure 1).

A transformation turns one example's tokenized text into one or more *views*:
token sequences `[start] ... [delim] ... [extract]` that go through the
model. The task head reads each view's last hidden state at `extract`.

| transformation     | views                                               | head input            |
|--------------------|-----------------------------------------------------|-----------------------|
| `Classification`   | `[start] text [extract]`                            | the one state         |
| `Entailment`       | `[start] premise [delim] hypothesis [extract]`      | the one state         |
| `Similarity`       | `[start] a [delim] b [extract]` and `... b ... a`   | the two states summed |
| `MultipleChoice(k)`| `[start] context [delim] answer_i [extract]`, i<k   | one score per view    |

Truncation policy, the same for every task: when a view is longer than
`max_length`, tokens are cut from the end of its *longest* segment, one at
a time, until it fits (special tokens and short segments are kept whole).
Every truncated example is counted and reported by the caller.
"""

import dataclasses

import keras

from kgpt.checks import positive_int
from kgpt.tasks.configurable import Configurable


@dataclasses.dataclass(frozen=True)
class Layout:
    """Special token ids that frame every view."""

    start: int
    delimiter: int
    extract: int

    @classmethod
    def from_tokenizer(cls, tokenizer):
        return cls(tokenizer.start_id, tokenizer.delimiter_id, tokenizer.extract_id)


class Transform(Configurable):
    """Base class: splits an example's segments into views of segment groups.

    `groups(segments, choices)` returns, per view, a tuple of groups; each
    group is a tuple of token-id lists that are concatenated, and groups are
    joined by the delimiter. Subclasses set `kind`, `num_segments` (an exact
    count, or `None` for "one or more"), `num_views` and `takes_choices`
    (whether examples carry answer choices, one view each). Transformations
    are saved with a fine-tuned model (`get_config`), so it can preprocess
    raw text without the task's plugin.
    """

    kind = "transform"
    num_segments = None
    num_views = 1
    takes_choices = False

    def groups(self, segments, choices=()):
        raise NotImplementedError

    @property
    def min_length(self):
        """The shortest view that holds text: the start and extract tokens, a delimiter between parts, and one
        token of each part (3 for classification, 5 for a pair or an answer after its context)."""
        segments = [[0]] * (self.num_segments or 1)
        parts = len(self.groups(segments, [[0]] * self.num_views if self.takes_choices else ())[0])
        return 1 + 2 * parts

    def check(self, segments, choices=()):
        """Error text when an example does not fit this transformation, else None."""
        if self.num_segments is None:
            if not segments:
                return f"{self.kind} needs at least one text segment"
        elif len(segments) != self.num_segments:
            return f"{self.kind} needs {self.num_segments} text segments, got {len(segments)}"
        if choices and not self.takes_choices:
            return f"{self.kind} takes no answer choices, got {len(choices)}"
        return None


@keras.saving.register_keras_serializable(package="kgpt.tasks.transforms")
class Classification(Transform):
    """`[start] text [extract]`; several segments are concatenated."""

    kind = "classification"

    def groups(self, segments, choices=()):
        return [(tuple(segments),)]


@keras.saving.register_keras_serializable(package="kgpt.tasks.transforms")
class Entailment(Transform):
    """`[start] premise [delim] hypothesis [extract]`."""

    kind = "entailment"
    num_segments = 2

    def groups(self, segments, choices=()):
        premise, hypothesis = segments
        return [((premise,), (hypothesis,))]


@keras.saving.register_keras_serializable(package="kgpt.tasks.transforms")
class Similarity(Transform):
    """Both orders `[start] a [delim] b [extract]`, `[start] b [delim] a [extract]`.

    The head adds the two extract states, so the prediction does not depend
    on which sentence comes first.
    """

    kind = "similarity"
    num_segments = 2
    num_views = 2

    def groups(self, segments, choices=()):
        a, b = segments
        return [((a,), (b,)), ((b,), (a,))]


@keras.saving.register_keras_serializable(package="kgpt.tasks.transforms")
class MultipleChoice(Transform):
    """`[start] context [delim] answer_k [extract]` for each of `num_choices` answers.

    The context is one or more segments (e.g. an article and a question),
    concatenated. The head gives one score per answer and a softmax over them.
    `num_segments`, when given, is how many context segments every example
    has (RACE: 2): it is saved with the model, so a text line or table row
    with one answer too many is refused instead of read as another context.

    Example: `MultipleChoice(4, num_segments=2).check(("article",), ("a", "b", "c", "d"))`
    gives `"multiple_choice needs 2 context segments, got 1"`.
    """

    kind = "multiple_choice"
    takes_choices = True

    def __init__(self, num_choices, num_segments=None):
        self.num_views = positive_int(num_choices, "num_choices", minimum=2)
        self.num_segments = positive_int(num_segments, "num_segments", allow_none=True)

    def check(self, segments, choices=()):
        if not segments:
            return "multiple_choice needs at least one context segment"
        if self.num_segments is not None and len(segments) != self.num_segments:
            return f"multiple_choice needs {self.num_segments} context segments, got {len(segments)}"
        if len(choices) != self.num_views:
            return f"multiple_choice needs {self.num_views} answer choices, got {len(choices)}"
        return None

    def groups(self, segments, choices=()):
        return [(tuple(segments), (choice,)) for choice in choices]

    def get_config(self):
        # num_segments only when set: a model saved without it keeps its config.
        config = {"num_choices": self.num_views}
        if self.num_segments is not None:
            config["num_segments"] = self.num_segments
        return config


def truncate(segments, budget):
    """Cuts tokens from the end of the longest segment until all fit in `budget`.

    Returns `(segments, number_of_tokens_cut)`; ties cut the earliest segment.

    Example:
    ```python
    truncate([[1, 2, 3, 4], [5, 6]], budget=4)  # ([[1, 2], [5, 6]], 2)
    ```
    """
    budget = positive_int(budget, "budget", minimum=0)
    lengths = [len(s) for s in segments]
    excess = sum(lengths) - budget
    if excess <= 0:
        return [list(s) for s in segments], 0
    cut = excess
    while excess > 0:
        longest = max(lengths)
        i = lengths.index(longest)
        below = max([n for n in lengths if n < longest], default=0)
        # Cut down to the next length (or by what is left), then re-check.
        step = min(excess, longest - below) if lengths.count(longest) == 1 else 1
        lengths[i] -= step
        excess -= step
    return [list(s[:n]) for s, n in zip(segments, lengths)], cut


def build_views(transform, segments, choices, layout, max_length):
    """Token id lists, one per view, and the number of tokens truncated.

    `segments` and `choices` are lists of token-id lists; every view has at
    most `max_length` tokens (see the module's truncation policy).
    """
    views, cut = [], 0
    for groups in transform.groups(segments, choices):
        sizes = [len(g) for g in groups]
        flat = [seg for group in groups for seg in group]
        specials = 1 + len(groups)  # start, one delimiter between groups, extract
        if max_length - specials < len(groups):
            raise ValueError(f"max_length={max_length} leaves no room for text in a {transform.kind} view.")
        flat, n = truncate(flat, max_length - specials)
        cut += n
        ids, k = [layout.start], 0
        for g, size in enumerate(sizes):
            if g:
                ids.append(layout.delimiter)
            for seg in flat[k : k + size]:
                ids.extend(seg)
            k += size
        ids.append(layout.extract)
        views.append(ids)
    return views, cut
