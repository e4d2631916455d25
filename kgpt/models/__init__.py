"""The keras-hub kinds: the GPT backbone (tokens -> hidden states), its tokenizer and preprocessors, the
causal LM and task models on top, the Table 5 LSTM, the LM loss both models train with and the paper's
optimizer that their `compile()` defaults to; loading the original release's and Hugging Face's weights.
"""
