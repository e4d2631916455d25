"""The networks: the GPT backbone (tokens -> hidden states), the causal LM and task models on top, the
Table 5 LSTM, and the LM loss both models train with.
"""
