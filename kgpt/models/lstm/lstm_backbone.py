"""The LSTM of the paper's Table 5 ablation, as a drop-in backbone.

"A single layer 2048 unit LSTM using the same framework": the same token
embedding (tied to the LM head), the same heads and auxiliary LM loss, the
transformer blocks replaced by LSTM layers. A linear projection brings the
LSTM's units back to the embedding width so the LM head stays tied.
"""

import keras
from keras_hub.layers import ReversibleEmbedding
from keras_hub.models import Backbone

from kgpt import checks
from kgpt.io.presets import PresetMixin
from kgpt.models.gpt.gpt_backbone import AddedTokensMixin, normal_initializer


@keras.saving.register_keras_serializable(package="kgpt")
class LSTMBackbone(AddedTokensMixin, PresetMixin, Backbone):
    """Token ids -> LSTM states projected to `hidden_dim`, `[batch, length, hidden_dim]`.

    Takes the same inputs as `GPTBackbone` (`token_ids`, `padding_mask`), so
    `GPTCausalLM`, `GPTTaskModel`, pre-training and fine-tuning use it
    unchanged. The recurrence is causal by construction; pad on the right
    (padded steps come after every real one and change nothing before them).

    Args:
        vocabulary_size: int. Rows of the token embedding (tied to the LM head).
        hidden_dim: int. Embedding width, and the width of the output states.
        lstm_units: int. Units per LSTM layer (paper: 2048).
        num_layers: int. Stacked LSTM layers (paper: 1).
        max_sequence_length: int. Longest input the tools will give it (an
            LSTM has no position table; kept for the shared interface).
        dropout: float. Dropout on the embeddings and on the output states.

    Example:
    ```python
    backbone = kgpt.LSTMBackbone(vocabulary_size=100, hidden_dim=16, lstm_units=32)
    lm = kgpt.GPTCausalLM(backbone)
    ```
    """

    def __init__(
        self,
        vocabulary_size,
        hidden_dim=768,
        lstm_units=2048,
        num_layers=1,
        max_sequence_length=512,
        dropout=0.1,
        dtype=None,
        **kwargs,
    ):
        checks.model_kwargs(kwargs, type(self).__name__)
        # Plain ints and a float, checked here: NumPy sizes fail inside Keras' LSTM, and they are saved.
        vocabulary_size, hidden_dim, lstm_units, num_layers, max_sequence_length = (
            checks.positive_int(value, name)
            for value, name in (
                (vocabulary_size, "vocabulary_size"),
                (hidden_dim, "hidden_dim"),
                (lstm_units, "lstm_units"),
                (num_layers, "num_layers"),
                (max_sequence_length, "max_sequence_length"),
            )
        )
        dropout = checks.rate(dropout, "dropout")

        # === Layers ===
        self.token_embedding = ReversibleEmbedding(
            input_dim=vocabulary_size,
            output_dim=hidden_dim,
            embeddings_initializer=normal_initializer(),
            dtype=dtype,
            name="token_embedding",
        )
        self.embeddings_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embeddings_dropout")
        self.lstm_layers = [
            keras.layers.LSTM(lstm_units, return_sequences=True, dtype=dtype, name=f"lstm_{i}")
            for i in range(num_layers)
        ]
        self.output_projection = keras.layers.Dense(
            hidden_dim, kernel_initializer=normal_initializer(), dtype=dtype, name="output_projection"
        )
        self.output_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="output_dropout")

        # === Functional Model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        x = self.embeddings_dropout(self.token_embedding(token_ids))  # [B, T, H]
        for layer in self.lstm_layers:
            x = layer(x)  # [B, T, U]
        x = self.output_dropout(self.output_projection(x))  # [B, T, H]
        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask},
            outputs=x,
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.vocabulary_size = vocabulary_size
        self.hidden_dim = hidden_dim
        self.lstm_units = lstm_units
        self.num_layers = num_layers
        self.max_sequence_length = max_sequence_length
        self.dropout = dropout

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "hidden_dim": self.hidden_dim,
                "lstm_units": self.lstm_units,
                "num_layers": self.num_layers,
                "max_sequence_length": self.max_sequence_length,
                "dropout": self.dropout,
            }
        )
        return config

    supports_cache = False  # GPTCausalLM.generate reruns the whole sequence at each step

    def save_original(self, *args, **kwargs):
        """Refused: the original release and Hugging Face formats hold a transformer, not an LSTM."""
        raise TypeError("LSTMBackbone has no original or Hugging Face GPT-1 format: only a GPTBackbone can be written.")

    def transferred_layers(self, num_layers):
        """The layers copied when transferring the embedding and the first `num_layers` LSTMs."""
        head = [self.output_projection] if num_layers == self.num_layers else []
        return [self.token_embedding, *self.lstm_layers[:num_layers], *head]
