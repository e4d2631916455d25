"""The original GPT-1 release's and Hugging Face's `openai-gpt` files, read, checked and mapped onto the layers."""
