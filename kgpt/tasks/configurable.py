"""`Configurable`: small value objects saved by their constructor arguments (heads, transformations)."""


class Configurable:
    """Saved as `get_config()` (the constructor's arguments) and compared by it.

    Subclasses return their constructor arguments from `get_config`; Keras'
    `serialize_keras_object` then saves them inside a model's config, and
    `from_config` rebuilds an equal object.
    """

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()

    def __hash__(self):
        return hash((type(self).__name__, repr(sorted(self.get_config().items()))))

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"
