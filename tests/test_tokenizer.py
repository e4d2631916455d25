import json
import os
import shutil

import pytest

import kgpt
from kgpt.models.gpt.gpt_tokenizer import GPTTokenizer

ASSETS = os.path.join(os.path.dirname(kgpt.__file__), "assets", "gpt1_bpe")


@pytest.fixture(scope="module")
def gpt1():
    return GPTTokenizer.gpt1()


def test_original_vocabulary_layout(gpt1):
    d = gpt1.decoder
    assert d[0] == "<unk>" and d[1] == "." and d[239] == ".</w>"
    assert d[477] == "th" and d[40476] == "bachelorette</w>" and d[40477] == "\n</w>"
    assert (gpt1.start_id, gpt1.delimiter_id, gpt1.extract_id) == (40478, 40479, 40480)
    assert gpt1.vocabulary_size() == 40481


def test_known_encodings(gpt1):
    assert gpt1.encode("bachelorette") == [40476]  # the last merge
    assert gpt1.encode("The") == [gpt1.encoder["the</w>"]]  # lower-cased
    assert gpt1.encode("a\nb") == [gpt1.encoder["a</w>"], 40477, gpt1.encoder["b</w>"]]
    assert gpt1.encode("\u0378") == [0]  # an unassigned code point: unknown


def test_bpe_merges_lowest_rank_first():
    symbols = ["<unk>", "a", "b", "c", "a</w>", "b</w>", "c</w>", "ab", "bc</w>", "abc</w>"]
    encoder = {s: i for i, s in enumerate(symbols)}
    tok = GPTTokenizer(encoder, [("b", "c</w>"), ("a", "b"), ("a", "bc</w>")])
    # (b, c</w>) has rank 0, so 'abc' -> a + bc</w> -> abc</w>; never ab + c</w>.
    assert tok.bpe("abc") == ["abc</w>"]
    tok2 = GPTTokenizer(encoder, [("a", "b"), ("b", "c</w>")])
    assert tok2.bpe("abc") == ["ab", "c</w>"]
    # The word 'ab' ends in b</w>, which the merge (a, b) does not match.
    assert tok2.encode("abc ab") == [7, 6, 1, 5]
    assert tok2.encode("abd") == [7, 0]  # 'd</w>' is unknown -> 0
    assert tok2.vocabulary_size() == len(symbols) + 3


def test_words_split_like_spacy_for_common_cases(gpt1):
    assert gpt1.words("I don't think it's 3.5 miles...") == [
        "i",
        "do",
        "n't",
        "think",
        "it",
        "'s",
        "3.5",
        "miles",
        "...",
    ]


def test_decode_round_trip(gpt1):
    text = "The keeper wrote the date, and the wind."
    assert gpt1.decode(gpt1.encode(text)) == "the keeper wrote the date , and the wind ."
    assert gpt1.decode([gpt1.start_id, gpt1.encoder["hi</w>"], gpt1.extract_id]) == "_start_ hi _classify_"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        gpt1.decode([10**6])


def test_save_load_round_trip(gpt1, tmp_path):
    gpt1.save(tmp_path)
    loaded = GPTTokenizer.from_original(tmp_path)
    text = "Saving and loading keeps every id the same: 123, ok?"
    assert loaded.encode(text) == gpt1.encode(text)
    assert loaded.vocabulary_size() == gpt1.vocabulary_size()


def test_bad_files_name_the_file(tmp_path):
    good_merges = tmp_path / "m.bpe"
    good_merges.write_text("#version: 0.2\na b\n")
    with pytest.raises(FileNotFoundError, match="missing.json"):
        GPTTokenizer.from_original(str(tmp_path / "missing.json"), str(good_merges))
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: not a JSON encoder"):
        GPTTokenizer.from_original(str(bad_json), str(good_merges))
    gaps = tmp_path / "gaps.json"
    gaps.write_text(json.dumps({"a": 0, "b": 2}))
    with pytest.raises(ValueError, match="gaps.json: ids must be exactly 0..1"):
        GPTTokenizer.from_original(str(gaps), str(good_merges))
    twice = tmp_path / "twice.json"
    twice.write_text('{"a": 0, "b": 1, "a": 2}')  # json keeps the last "a": the vocabulary lost a token
    with pytest.raises(ValueError, match=r"twice.json: the token 'a' is given twice\.$"):
        GPTTokenizer.from_original(str(twice), str(good_merges))
    enc = tmp_path / "enc.json"
    enc.write_text(json.dumps({"a": 0, "b": 1, "ab": 2}))
    no_header = tmp_path / "nohdr.bpe"
    no_header.write_text("a b\n")
    with pytest.raises(ValueError, match="nohdr.bpe:1: expected a '#version'"):
        GPTTokenizer.from_original(str(enc), str(no_header))
    bad_line = tmp_path / "badline.bpe"
    bad_line.write_text("#version: 0.2\na b\na b c\n")
    with pytest.raises(ValueError, match="badline.bpe:3: expected two symbols"):
        GPTTokenizer.from_original(str(enc), str(bad_line))


def test_encode_rejects_non_strings(gpt1):
    with pytest.raises(TypeError, match="takes a str"):
        gpt1.encode(b"bytes")


def test_exported_at_top_level():
    assert kgpt.GPTTokenizer is GPTTokenizer


def test_train_learns_a_vocabulary_in_the_original_layout(tmp_path, capsys, progress):
    corpus = tmp_path / "corpus.txt"
    text = "The keeper climbed the steps of the tower.\nThe keeper wrote the date, then the weather.\n"
    corpus.write_text(text * 50 + "Zebra!\n", encoding="utf-8")
    capsys.readouterr()
    tokenizer = kgpt.GPTTokenizer.train([str(corpus)], num_merges=30, directory=str(tmp_path / "bpe"))
    assert len(tokenizer.merges) == 30 and not capsys.readouterr().out  # nothing to report
    # "th" is by far the most frequent pair of symbols, so it is the first merge, as in the original.
    assert tokenizer.merges[0] == ("t", "h")
    decoder = {i: s for s, i in tokenizer.encoder.items()}
    assert decoder[0] == "<unk>" and decoder[len(tokenizer.encoder) - 4] == "\n</w>"
    assert {"z", "z</w>", "!", "!</w>"} <= set(tokenizer.encoder)  # every character, in both forms
    # The files are the original formats: from_original() reads them back to the same tokenizer.
    again = kgpt.GPTTokenizer.from_original(
        str(tmp_path / "bpe" / "encoder_bpe_40000.json"), str(tmp_path / "bpe" / "vocab_40000.bpe")
    )
    sample = "The keeper climbed the tower. Zebra!"
    assert again.encode(sample) == tokenizer.encode(sample)
    assert tokenizer.decode(tokenizer.encode(sample)) == "the keeper climbed the tower . zebra !"
    assert tokenizer.bpe("the") == ["the</w>"]
    # A corpus too small for the merges asked for says how many it learned.
    small = kgpt.GPTTokenizer.train([str(corpus)], num_merges=5000)
    lines = capsys.readouterr().out.splitlines()  # kgpt's logger prints to the current stdout
    assert len(small.merges) < 5000 and lines[0].startswith(f"Learned {len(small.merges):,} of 5,000 merges")


def test_gpt1_is_the_original_algorithm_and_regex_a_choice(gpt1):
    assert gpt1.splitter == "spacy" and GPTTokenizer.from_original(ASSETS).splitter == "spacy"
    regex = GPTTokenizer.gpt1(splitter="regex")
    text = "The keeper didn't climb the steps; he wrote the date -- 12.5 miles away!\nNext line."
    assert regex.encode(text) == gpt1.encode(text)
    # spaCy's exception list, which the regex lacks.
    assert gpt1.words("Mrs. Marrow") == ["mrs.", "marrow"] and regex.words("Mrs. Marrow") == ["mrs", ".", "marrow"]
    assert gpt1.fingerprint() != regex.fingerprint()  # the shards of one are not the other's


def test_unknown_splitter():
    with pytest.raises(ValueError, match="splitter must be one of 'spacy', 'regex'"):
        kgpt.GPTTokenizer({"a": 0}, [], splitter="nltk")


def test_files_record_the_splitter_they_were_made_with(gpt1, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Mrs. Marrow kept the log. Mr. Hollis wrote it up.\n" * 20, encoding="utf-8")
    learned = GPTTokenizer.train([str(corpus)], num_merges=40, directory=str(tmp_path / "bpe"))
    assert learned.splitter == "regex"
    header = (tmp_path / "bpe" / "vocab_40000.bpe").read_text(encoding="utf-8").split("\n")[0]
    assert header == "#version: 0.2 kgpt-splitter: regex"
    again = GPTTokenizer.from_original(str(tmp_path / "bpe"))
    assert again.splitter == "regex" and again.encode("Mrs. Marrow") == learned.encode("Mrs. Marrow")
    assert GPTTokenizer.from_original(str(tmp_path / "bpe"), splitter="spacy").splitter == "spacy"  # an override
    exact = GPTTokenizer.train([str(corpus)], num_merges=40, splitter="spacy")
    assert exact.words("Mrs. Marrow") == ["mrs.", "marrow"]
    gpt1.save(tmp_path / "copy")
    assert GPTTokenizer.from_original(str(tmp_path / "copy")).splitter == "spacy"
    merges = tmp_path / "copy" / "vocab_40000.bpe"
    merges.write_text(merges.read_text(encoding="utf-8").replace("spacy", "nltk", 1), encoding="utf-8")
    with pytest.raises(kgpt.CheckpointError, match="vocab_40000.bpe:1: unknown splitter 'nltk'"):
        GPTTokenizer.from_original(str(tmp_path / "copy"))


def test_a_merges_file_cut_short_is_refused(tmp_path):
    shutil.copy(os.path.join(ASSETS, "encoder_bpe_40000.json"), tmp_path)
    lines = open(os.path.join(ASSETS, "vocab_40000.bpe"), encoding="utf-8").read().split("\n")
    (tmp_path / "vocab_40000.bpe").write_text("\n".join(lines[:20001]) + "\n", encoding="utf-8")  # a line end
    with pytest.raises(
        kgpt.CheckpointError,
        match=r"vocab_40000.bpe:20001: the merges end here, after 20,000, "
        r"but 20,000 symbol\(s\) of .*encoder_bpe_40000.json come from no merge",
    ):
        GPTTokenizer.from_original(str(tmp_path))
    (tmp_path / "vocab_40000.bpe").write_text("\n".join(lines[:20001] + ["bachel"]), encoding="utf-8")
    with pytest.raises(kgpt.CheckpointError, match="vocab_40000.bpe:20002: expected two symbols"):
        GPTTokenizer.from_original(str(tmp_path))

    # Two merges swapped: the second joins a symbol the first (now later) makes, so it could never fire.
    made = {a + b: i for i, (a, b) in enumerate(line.split() for line in lines[1:40001])}
    user, part = next((i, p) for i, line in enumerate(lines[1:40001]) for p in line.split() if p in made)
    maker = made[part]
    swapped = list(lines)
    swapped[1 + maker], swapped[1 + user] = lines[1 + user], lines[1 + maker]
    (tmp_path / "vocab_40000.bpe").write_text("\n".join(swapped), encoding="utf-8")
    with pytest.raises(kgpt.CheckpointError, match=rf"vocab_40000.bpe:{maker + 2}: merge .* joins {part!r}, which no"):
        GPTTokenizer.from_original(str(tmp_path))
    # A merge given twice can apply once only: loaded without a word before.
    again = [*lines[:4], lines[2], *lines[4:]]
    (tmp_path / "vocab_40000.bpe").write_text("\n".join(again), encoding="utf-8")
    with pytest.raises(kgpt.CheckpointError, match=rf"^.*vocab_40000.bpe:5: merge {lines[2]!r} is line 3's again\.$"):
        GPTTokenizer.from_original(str(tmp_path))


def test_over_long_words_are_cut_and_counted(gpt1):
    import random
    import string
    import time

    rng = random.Random(0)
    word = "".join(rng.choice(string.ascii_lowercase) for _ in range(300_000))
    start = time.perf_counter()
    with pytest.warns(UserWarning, match="Cut 1 word.s. longer than 1,000 characters"):
        ids = gpt1.encode(f"A run: {word} ends.")
    assert time.perf_counter() - start < 60  # 214 s before words were cut and BPE ran on a heap
    pieces = " ".join(word[i : i + 1000] for i in range(0, len(word), 1000))
    assert ids == gpt1.encode(f"A run: {pieces} ends.")
    assert gpt1.text_encoder.cut_words == 1


def test_heap_bpe_equals_the_original_loop():
    import random

    from kgpt.tokenizers.gpt1.bpe import bpe_long, bpe_short

    def original(word, ranks):  # text_utils.py's loop, as written there
        word = tuple(word[:-1]) + (word[-1] + "</w>",)
        pairs = set(zip(word, word[1:]))
        while pairs:
            bigram = min(pairs, key=lambda pair: ranks.get(pair, float("inf")))
            if bigram not in ranks:
                break
            first, second = bigram
            new_word, i = [], 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            pairs = set(zip(word, word[1:])) if len(word) > 1 else set()
        return list(word)

    rng = random.Random(0)
    for trial in range(300):
        alphabet = "ab" if trial % 2 else "abc"
        words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40))) for _ in range(20)]
        # Merges from pairs of symbols seen in the words, in random order (not only a trainer's order).
        merges = []
        for word in words:
            symbols = original(word, {p: r for r, p in enumerate(merges)})
            for pair in zip(symbols, symbols[1:]):
                if pair not in merges and rng.random() < 0.5:
                    merges.insert(rng.randint(0, len(merges)), pair)
        ranks = {p: r for r, p in enumerate(merges)}
        for word in words:
            expected = original(word, ranks)
            assert bpe_short(word, ranks, merges) == expected and bpe_long(word, ranks, merges) == expected, word


# --- the keras-hub Tokenizer surface ------------------------------------------

TEXTS = ["The keeper didn't climb.", "a\nb", "", "Hello, world!!"]


def test_is_a_registered_keras_hub_tokenizer(gpt1):
    import keras
    import keras_hub

    assert isinstance(gpt1, keras_hub.tokenizers.Tokenizer)
    assert keras.saving.get_registered_name(GPTTokenizer) == "kgpt>GPTTokenizer"
    assert GPTTokenizer.backbone_cls is kgpt.GPTBackbone
    assert gpt1.get_config()["splitter"] == "spacy"
    # Keras attribute tracking would wrap these in (slower) tracked copies.
    assert type(gpt1.encoder) is dict and type(gpt1.text_encoder.word_ids) is dict and type(gpt1.merges) is list


def test_callable_on_a_string_a_list_and_string_tensors(gpt1):
    import numpy as np
    import tensorflow as tf

    one = gpt1(TEXTS[0])
    assert isinstance(one, np.ndarray) and one.dtype == np.int32
    assert one.tolist() == gpt1.encode(TEXTS[0])
    expected = [gpt1.encode(t) for t in TEXTS]
    assert gpt1(TEXTS) == expected and gpt1.tokenize(tuple(TEXTS)) == expected
    assert gpt1(tf.constant(TEXTS)) == expected
    assert gpt1(np.array(TEXTS)) == expected
    assert gpt1(tf.constant(TEXTS[0])).tolist() == expected[0]
    with pytest.raises(TypeError, match="takes strings; the list holds int"):
        gpt1(["a", 3])
    with pytest.raises(ValueError, match="rank-1 batch of strings, got shape"):
        gpt1(tf.constant([TEXTS]))


def test_tf_data_map_equals_encode(gpt1):
    import tensorflow as tf

    expected = [gpt1.encode(t) for t in TEXTS]
    unbatched = tf.data.Dataset.from_tensor_slices(TEXTS).map(gpt1)
    assert unbatched.element_spec.shape.as_list() == [None]
    assert [x.tolist() for x in unbatched.as_numpy_iterator()] == expected
    batched = tf.data.Dataset.from_tensor_slices(TEXTS).batch(3).map(gpt1)
    assert isinstance(batched.element_spec, tf.RaggedTensorSpec)
    rows = [row for batch in batched for row in batch.to_list()]
    assert rows == expected
    # ... and back: detokenize inside tf.data gives decode()'s strings.
    texts = batched.map(gpt1.detokenize)
    decoded = [t.decode("utf-8") for batch in texts.as_numpy_iterator() for t in batch]
    assert decoded == [gpt1.decode(ids) for ids in expected]


def test_detokenize_round_trip(gpt1):
    import keras
    import numpy as np
    import tensorflow as tf

    ids = [gpt1.encode(t) for t in TEXTS[:2]]
    decoded = [gpt1.decode(i) for i in ids]
    assert decoded == ["the keeper did n't climb .", "a\nb"]
    assert gpt1.detokenize(ids) == decoded
    assert gpt1.detokenize(ids[0]) == decoded[0]
    assert gpt1.detokenize(np.array(ids[0])) == decoded[0]
    assert gpt1.detokenize(tf.ragged.constant(ids)) == decoded
    square = np.array([ids[1], ids[1]], "int32")
    assert gpt1.detokenize(keras.ops.convert_to_tensor(square)) == [decoded[1]] * 2
    assert gpt1.detokenize(gpt1(TEXTS[0])) == decoded[0]
    with pytest.raises(ValueError, match="Token id 99999999 is outside the vocabulary"):
        gpt1.detokenize([[99999999]])


def test_vocabulary_lookups_and_special_tokens(gpt1):
    vocabulary = gpt1.get_vocabulary()
    assert len(vocabulary) == gpt1.vocabulary_size() == 40481
    assert vocabulary[:2] == ["<unk>", "."] and vocabulary[-3:] == ["_start_", "_delimiter_", "_classify_"]
    assert gpt1.token_to_id("the</w>") == gpt1.encoder["the</w>"] and gpt1.id_to_token(40477) == "\n</w>"
    with pytest.raises(ValueError, match="Token 'nope' is not in the vocabulary"):
        gpt1.token_to_id("nope")
    with pytest.raises(ValueError, match="Token id 40481 is outside the vocabulary"):
        gpt1.id_to_token(40481)
    assert set(gpt1.special_tokens) == {"_start_", "_delimiter_", "_classify_"}
    assert set(gpt1.special_token_ids) == {40478, 40479, 40480}
    # GPT-1's language model has no beginning/end-of-text token: pad with 0 under a mask, never stop.
    assert (gpt1.start_token_id, gpt1.end_token_id, gpt1.pad_token_id) == (40478, None, 0)
    assert (gpt1.delimiter_token_id, gpt1.extract_token_id) == (40479, 40480)


def test_an_empty_tokenizer_is_filled_by_load_assets(gpt1, tmp_path):
    empty = GPTTokenizer(splitter="spacy")
    assert empty.special_tokens and empty.start_token_id is None
    with pytest.raises(ValueError, match="no vocabulary yet"):
        empty.encode("hello")
    with pytest.raises(ValueError, match="Give both encoder and merges"):
        GPTTokenizer({"a": 0})
    gpt1.save_assets(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(gpt1.file_assets)
    empty.load_assets(str(tmp_path))
    assert empty.encode(TEXTS[0]) == gpt1.encode(TEXTS[0])
    assert empty.start_token_id == gpt1.start_id and empty.fingerprint() == gpt1.fingerprint()


def tiny_tokenizer_preset(path):
    from conftest import TINY, char_tokenizer

    tokenizer = char_tokenizer()
    kgpt.GPTBackbone(**{**TINY, "vocabulary_size": tokenizer.vocabulary_size()}).save_to_preset(str(path))
    tokenizer.save_to_preset(str(path))
    return tokenizer


def test_save_to_preset_loads_through_keras_hub_and_kgpt(tmp_path):
    import keras_hub

    tokenizer = tiny_tokenizer_preset(tmp_path)
    config = json.loads((tmp_path / "tokenizer.json").read_text())
    assert config["registered_name"] == "kgpt>GPTTokenizer" and config["config"]["splitter"] == "regex"
    assert sorted(p.name for p in (tmp_path / "assets" / "tokenizer").iterdir()) == [
        "encoder_bpe_40000.json",
        "vocab_40000.bpe",
    ]
    text = "a cab, 12 dogs!"
    for loaded in (keras_hub.tokenizers.Tokenizer.from_preset(str(tmp_path)), GPTTokenizer.from_preset(tmp_path)):
        assert type(loaded) is GPTTokenizer
        assert loaded.fingerprint() == tokenizer.fingerprint()
        assert loaded(text).tolist() == tokenizer.encode(text)
    assert GPTTokenizer.from_preset(tmp_path / "assets" / "tokenizer").encode(text) == tokenizer.encode(text)


def test_preset_files_missing_or_corrupt_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder .*a Hub preset loaded with from_preset"):
        GPTTokenizer.from_preset(str(tmp_path / "absent"))
    tiny_tokenizer_preset(tmp_path)
    encoder = tmp_path / "assets" / "tokenizer" / "encoder_bpe_40000.json"
    encoder.write_text("{broken")
    with pytest.raises(kgpt.CheckpointError, match="encoder_bpe_40000.json: not a JSON encoder file"):
        GPTTokenizer.from_preset(str(tmp_path))
    encoder.unlink()
    with pytest.raises(FileNotFoundError, match="encoder_bpe_40000.json"):
        GPTTokenizer.from_preset(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text(
        json.dumps({"module": "keras.layers", "class_name": "Dense", "config": {}, "registered_name": "Dense"})
    )
    with pytest.raises(kgpt.CheckpointError, match="tokenizer.json: expected a kgpt GPTTokenizer config"):
        GPTTokenizer.from_preset(str(tmp_path))


def _files(folder):
    """Every file under `folder` with its bytes."""
    return {
        os.path.relpath(os.path.join(root, name), folder): open(os.path.join(root, name), "rb").read()
        for root, _, names in os.walk(folder)
        for name in names
    }


def test_a_tokenizer_saved_beside_a_model_must_fit_it(tmp_path, caplog):
    # GPT-1's tokenizer saved into a 605-id model's preset replaced its files without a word: the preset then failed
    # to load, or, for a vocabulary of the model's size, tokenized with another vocabulary.
    from conftest import TINY, char_tokenizer, newline_tokenizer

    tokenizer = char_tokenizer()
    size = tokenizer.vocabulary_size()
    preset = tmp_path / "preset"
    kgpt.GPTCausalLM(
        kgpt.GPTBackbone(**{**TINY, "vocabulary_size": size}),
        preprocessor=kgpt.GPTCausalLMPreprocessor(tokenizer, sequence_length=16),
    ).save_to_preset(str(preset))
    before = _files(preset)
    bigger = newline_tokenizer()
    with pytest.raises(ValueError) as refused:
        bigger.save_to_preset(str(preset))
    assert str(refused.value) == (
        f"{preset} holds a model of vocabulary_size={size} (config.json), which this tokenizer of "
        f"{bigger.vocabulary_size()} ids does not fit: nothing was written. Save the tokenizer to another folder."
    )
    assert _files(preset) == before
    # Another vocabulary of the model's size (two ids swapped) replaces the one there with a warning.
    swapped = dict(tokenizer.encoder)
    swapped["a</w>"], swapped["b</w>"] = tokenizer.encoder["b</w>"], tokenizer.encoder["a</w>"]
    with caplog.at_level("WARNING", logger="kgpt"):
        char_tokenizer().save_to_preset(str(preset))  # the same one again: silent
        assert caplog.records == []
        GPTTokenizer(swapped, []).save_to_preset(str(preset))
    assert [r.getMessage() for r in caplog.records] == [
        f"Warning: {preset} held another tokenizer: it is replaced by this one, which the model saved there now "
        f"loads with."
    ]
    assert GPTTokenizer.from_preset(str(preset)).encode("a b") == [swapped["a</w>"], swapped["b</w>"]]


def test_a_tokenizer_saved_before_its_model_or_without_one_is_silent(tmp_path, caplog):
    from conftest import TINY, char_tokenizer

    tokenizer = char_tokenizer()
    size = tokenizer.vocabulary_size()
    with caplog.at_level("WARNING", logger="kgpt"):
        tokenizer.save_to_preset(str(tmp_path / "alone"))
        tokenizer.save_to_preset(str(tmp_path / "run"))  # a pre-training run: the tokenizer first, the model later
        kgpt.GPTCausalLM(
            kgpt.GPTBackbone(**{**TINY, "vocabulary_size": size}),
            preprocessor=kgpt.GPTCausalLMPreprocessor(char_tokenizer(), sequence_length=16),
        ).save_to_preset(str(tmp_path / "run"))
        # A pre-trained backbone without the paper's 3 added tokens, which fine-tuning adds (the original release's).
        kgpt.GPTBackbone(**{**TINY, "vocabulary_size": size - 3}).save_to_preset(str(tmp_path / "pretrained"))
        tokenizer.save_to_preset(str(tmp_path / "pretrained"))
    assert caplog.records == []
    assert GPTTokenizer.from_preset(str(tmp_path / "pretrained")).fingerprint() == tokenizer.fingerprint()
