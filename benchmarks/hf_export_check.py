"""Checks by hand that Hugging Face `transformers` loads kgpt's openai-gpt export with the same outputs.

Not a test and not part of kgpt: the `compare` step imports `torch` and
`transformers`, which kgpt never needs. Run the two steps in two environments:

    # 1. kgpt's environment: random weights -> DIR (Hugging Face files) + DIR/kgpt_outputs.npz
    KERAS_BACKEND=jax python benchmarks/hf_export_check.py export /tmp/hf_tiny --size tiny
    KERAS_BACKEND=jax python benchmarks/hf_export_check.py export /tmp/hf_gpt1 --size gpt1

    # 2. an environment with torch + transformers (no keras needed)
    python benchmarks/hf_export_check.py compare /tmp/hf_tiny
    python benchmarks/hf_export_check.py compare /tmp/hf_gpt1

`export` builds a backbone (`tiny`: 2 layers, hidden 16, a 60-merge BPE
learned on kgpt's demo corpus; `gpt1`: the paper's 12 x 768 shape with the
shipped 40,478-token vocabulary), adds the start/delimiter/extract rows,
perturbs every weight with N(0, scale) noise so that attention is far from
uniform, writes it with `save_original(format="huggingface", tokenizer=...)`
and saves kgpt's last hidden states and tied-LM logits on random ids (row 1
right-padded) and kgpt's token ids for a few sentences. `compare` loads the
folder with `OpenAIGPTModel`, `OpenAIGPTLMHeadModel` and
`OpenAIGPTTokenizer.from_pretrained` and prints the largest differences.
"""

import argparse
import json
import os
import sys

SENTENCES = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "It was a bright cold day in April, and the clocks were striking thirteen.",
    "Numbers like 3.14 and 2,000 (and 42) are split too; so are dashes - right?",
    "I don't think it's John's car.",
    "Café naïve résumé",
    "_start_ the premise _delimiter_ the hypothesis _classify_",
]
SIZES = {
    "tiny": dict(num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=64, max_sequence_length=32),
    "gpt1": dict(num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072, max_sequence_length=512),
}
OUTPUTS = "kgpt_outputs.npz"


def export(directory, size, scale, seed):
    import keras
    import numpy as np

    import kgpt

    if size == "tiny":
        import tempfile

        from kgpt.data import demo_world

        with tempfile.TemporaryDirectory() as scratch:
            tokenizer = kgpt.GPTTokenizer.train([demo_world.write_corpus(scratch)], num_merges=60)
    else:
        tokenizer = kgpt.GPTTokenizer.gpt1()
    keras.utils.set_random_seed(seed)
    backbone = kgpt.GPTBackbone(vocabulary_size=tokenizer.vocabulary_size(), dropout=0.0, **SIZES[size])
    rng = np.random.default_rng(seed)
    for variable in backbone.weights:
        value = keras.ops.convert_to_numpy(variable)
        variable.assign(value + rng.normal(0.0, scale, value.shape).astype("float32"))
    backbone.save_original(directory, format="huggingface", tokenizer=tokenizer, overwrite=True)

    length = backbone.max_sequence_length
    ids = rng.integers(0, backbone.vocabulary_size, (2, length)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, length // 3 :] = 0  # right padding: kgpt's padding_mask is Hugging Face's attention_mask
    x = {"token_ids": ids, "padding_mask": mask}
    hidden = keras.ops.convert_to_numpy(backbone(x))
    logits = keras.ops.convert_to_numpy(kgpt.GPTCausalLM(backbone)(x))[:, :32]
    np.savez(
        os.path.join(directory, OUTPUTS),
        ids=ids,
        mask=mask,
        hidden=hidden,
        logits=logits,
        sentence_ids=np.array(json.dumps([tokenizer.encode(s) for s in SENTENCES])),
    )
    print(
        f"wrote {directory}: {backbone.count_params():,} weights, vocabulary {backbone.vocabulary_size:,}, "
        f"{keras.config.backend()} backend"
    )


def compare(directory):
    import numpy as np
    import torch
    import transformers
    from transformers import OpenAIGPTLMHeadModel, OpenAIGPTModel, OpenAIGPTTokenizer

    saved = np.load(os.path.join(directory, OUTPUTS))
    ids, mask = torch.tensor(saved["ids"], dtype=torch.long), torch.tensor(saved["mask"])
    real = saved["mask"].astype(bool)  # padded positions' states are not defined the same way
    model = OpenAIGPTModel.from_pretrained(directory).eval()
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state.numpy()
        logits = (
            OpenAIGPTLMHeadModel.from_pretrained(directory)
            .eval()(input_ids=ids, attention_mask=mask)
            .logits.numpy()[:, :32]
        )
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {directory}")
    print(
        f"last hidden states {list(hidden.shape)}: max abs diff {np.abs(hidden - saved['hidden'])[real].max():.3g} "
        f"(values up to {np.abs(saved['hidden']).max():.3g})"
    )
    print(
        f"LM logits {list(logits.shape)}: max abs diff {np.abs(logits - saved['logits'])[real[:, :32]].max():.3g} "
        f"(values up to {np.abs(saved['logits']).max():.3g})"
    )

    tokenizer = OpenAIGPTTokenizer.from_pretrained(directory)
    kgpt_ids = json.loads(str(saved["sentence_ids"]))
    same = 0
    for sentence, want in zip(SENTENCES, kgpt_ids):
        got = tokenizer(sentence, add_special_tokens=False)["input_ids"]
        same += got == want
        print(
            f"  {'same' if got == want else 'DIFFERENT'}: {sentence!r}"
            + (
                ""
                if got == want
                else f"\n    kgpt {tokenizer.convert_ids_to_tokens(want)}"
                f"\n    HF   {tokenizer.convert_ids_to_tokens(got)}"
            )
        )
    print(f"tokenizer: {same}/{len(SENTENCES)} sentences give the same ids; vocabulary {len(tokenizer):,}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=["export", "compare"])
    parser.add_argument("directory")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--scale", type=float, default=None, help="weight noise (default: 0.3 tiny, 0.05 gpt1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.step == "export":
        scale = args.scale if args.scale is not None else (0.3 if args.size == "tiny" else 0.05)
        export(args.directory, args.size, scale, args.seed)
    else:
        compare(args.directory)


if __name__ == "__main__":
    sys.exit(main())
