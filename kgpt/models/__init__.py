"""The keras-hub kinds: the GPT backbone (tokens -> hidden states), its tokenizer and preprocessors, the
causal LM and task models on top, the Table 5 LSTM; loading the original release's and Hugging Face's weights.
The LM loss both models train with and the paper's optimizer their `compile()` defaults to are `kgpt.train`'s.
"""
