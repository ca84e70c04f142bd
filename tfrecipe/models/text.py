"""A text classifier that takes raw strings: `model=text`.

    raw string -> TextVectorization (adapted on the training split) -> Embedding
      -> encoder: pooling (mean of the token embeddings) | conv (1-D convolutions, max pooling)
      -> dropout -> float32 head

The vectorizer is a layer of the model, so `model.keras` and the SavedModel take raw strings and
tokenize exactly as training did. Its vocabulary is not a trained weight (checkpoints do not hold
it): it is learnt again from the training split whenever the model is built, which gives the same
vocabulary every time (the split is seeded, and Keras orders tokens by count, ties by the token),
so a resumed run restores its weights onto the same token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import keras
import tensorflow as tf
from keras import layers

from tfrecipe.config.targets import config_target
from tfrecipe.models.builders import _logits

# Texts per adapt batch: large enough to keep TensorFlow busy, small enough for long reviews.
_ADAPT_BATCH = 512


@config_target
def text(
    *,
    input_shape: Sequence[int],
    num_outputs: int,
    train_features: tf.data.Dataset | None = None,
    vocabulary_size: int = 20_000,
    sequence_length: int = 256,
    standardize: str | None = "lower_and_strip_punctuation",
    embedding_dim: int = 64,
    encoder: Literal["pooling", "conv"] = "pooling",
    filters: Sequence[int] = (64,),
    kernel_size: int = 5,
    dropout: float = 0.2,
) -> keras.Model:
    """Vectorizer, embedding, encoder and head for raw-string inputs.

    Args:
      input_shape: the dataset's input shape; must be `()` (one string per example).
      num_outputs: the task's head width.
      train_features: the training split's texts (unbatched); the vectorizer learns its
        vocabulary from them only.
      vocabulary_size: the most frequent tokens kept (padding and out-of-vocabulary included).
      sequence_length: tokens per text (longer texts are cut, shorter ones padded).
      standardize: TextVectorization's standardization ("lower_and_strip_punctuation",
        "lower", "strip_punctuation" or null).
      embedding_dim: the width of each token's embedding.
      encoder: "pooling" averages the (unpadded) token embeddings; "conv" runs 1-D
        convolutions (`filters`, `kernel_size`) and keeps each filter's maximum.
      dropout: dropout before the head.

    Raises:
      ValueError: the inputs are not strings, or an option is out of range.
    """
    _check_options(vocabulary_size, sequence_length, embedding_dim, encoder, filters, kernel_size)
    _require_text(input_shape, train_features)
    inputs, tokens, width = _tokenize(train_features, vocabulary_size, sequence_length, standardize)
    x = _encoded(tokens, width, encoder, embedding_dim, filters, kernel_size)
    if dropout:
        x = layers.Dropout(dropout)(x)
    return keras.Model(inputs, _logits(x, num_outputs), name="text")


def _tokenize(
    train_features: tf.data.Dataset,
    vocabulary_size: int,
    sequence_length: int,
    standardize: str | None,
) -> tuple[keras.KerasTensor, keras.KerasTensor, int]:
    """(string input, its token ids, the vocabulary's size): a vectorizer adapted on the
    training texts, the model's first layer."""
    vectorizer = layers.TextVectorization(
        max_tokens=vocabulary_size,
        output_sequence_length=sequence_length,
        standardize=standardize,
        name="vectorizer",
    )
    vectorizer.adapt(train_features.batch(_ADAPT_BATCH))
    inputs = keras.Input(shape=(), dtype="string", name="text")
    # The actual vocabulary may be smaller than asked for (a small corpus).
    return inputs, vectorizer(inputs), vectorizer.vocabulary_size()


def _encoded(
    tokens: keras.KerasTensor,
    width: int,
    encoder: str,
    embedding_dim: int,
    filters: Sequence[int],
    kernel_size: int,
) -> keras.KerasTensor:
    """One vector per text: the mean of its token embeddings (pooling), or each 1-D convolution
    filter's maximum over the text (conv)."""
    if encoder == "pooling":
        x = layers.Embedding(width, embedding_dim, mask_zero=True, name="embedding")(tokens)
        return MaskedMean(name="masked_mean")(x)  # over the real tokens only (the mask)
    x = layers.Embedding(width, embedding_dim, name="embedding")(tokens)
    for count in filters:
        x = layers.Conv1D(count, kernel_size, padding="same", activation="relu")(x)
    return layers.GlobalMaxPooling1D()(x)


@keras.saving.register_keras_serializable(package="tfrecipe")
class MaskedMean(layers.Layer):
    """The mean of the unmasked steps of `(batch, steps, features)`: of the real tokens.

    A text with no token (empty, or punctuation only once standardized) has none: its mean is
    zeros, where `GlobalAveragePooling1D` divides 0 by 0 and the whole batch's loss becomes NaN
    (and the exported model predicts NaN for "").
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs, mask=None):
        if mask is None:
            return keras.ops.mean(inputs, axis=1)
        weights = keras.ops.expand_dims(keras.ops.cast(mask, inputs.dtype), -1)
        total = keras.ops.sum(inputs * weights, axis=1)
        return total / keras.ops.maximum(keras.ops.sum(weights, axis=1), 1)

    def compute_mask(self, inputs, mask=None):
        return None  # one vector per text: nothing left to mask

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])


def _require_text(input_shape: Sequence[int], train_features: tf.data.Dataset | None) -> None:
    if train_features is None:
        raise ValueError(
            "model=text learns its vocabulary from the training texts: pass train_features "
            "(tfrecipe.models.build.build_model does)"
        )
    dtype = train_features.element_spec.dtype
    if tuple(input_shape) != () or dtype != tf.string:
        raise ValueError(
            f"model=text expects raw text (one string per example), received "
            f"input_shape={list(input_shape)} of {dtype.name}; use a text dataset "
            "(dataset=text_folder, or dataset=tfds with a text feature_key)"
        )


def _check_options(
    vocabulary_size: int,
    sequence_length: int,
    embedding_dim: int,
    encoder: str,
    filters: Sequence[int],
    kernel_size: int,
) -> None:
    for name, value, least in (
        ("vocabulary_size", vocabulary_size, 3),  # padding, out-of-vocabulary, one token
        ("sequence_length", sequence_length, 1),
        ("embedding_dim", embedding_dim, 1),
        ("kernel_size", kernel_size, 1),
    ):
        if not isinstance(value, int) or value < least:
            raise ValueError(f"model.{name} must be an integer >= {least}, received {value!r}")
    if encoder not in ("pooling", "conv"):
        raise ValueError(f"model.encoder must be pooling or conv, received {encoder!r}")
    if not filters or not all(isinstance(f, int) and f > 0 for f in filters):
        raise ValueError(f"model.filters must be positive integers, received {list(filters)}")
