"""Tokenizers: the interface kgpt needs (`interface`), GPT-1's BPE (`gpt1`) and any keras-hub tokenizer
(`keras_hub_adapter`); `loading.load_tokenizer(dir)` reads whichever a folder holds."""
