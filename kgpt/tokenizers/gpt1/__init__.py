"""GPT-1's byte-pair encoding: normalisation (`normalize`), word splitting (`splitters`), the exact BPE
(`bpe`), the cached fast path (`encoder`), learning a vocabulary (`training`), its files (`files`) and the
keras-hub layer (`tokenizer`)."""
