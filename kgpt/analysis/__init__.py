"""The paper's section 5 analyses: the zero-shot heuristics and their evaluation, transfer depth and the
Table 5 ablations.
"""
