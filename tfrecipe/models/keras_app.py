"""`model=keras_app`: a `keras.applications` network (ResNet50, MobileNetV3Small, ...) as the
backbone of a head for the task.

    inputs (the pipeline's images, [0, 1] by default) -> Resizing to `input_size`
      -> "preprocess": the application's own preprocess_input (grey repeated to 3 channels)
      -> "backbone": the application without its top (a nested model: freezing and warm starts
         find it by name) -> global pooling -> dropout -> "logits" (float32)

Everything the images go through is inside the model, so the exported model takes the same raw
images as training.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
from keras import layers

from tfrecipe.config.targets import config_target
from tfrecipe.errors import ConfigError, Problem
from tfrecipe.models.builders import _logits, _require_image

BACKBONE = "backbone"


@config_target
def keras_app(
    *,
    input_shape: Sequence[int],
    num_outputs: int,
    name: str = "MobileNetV3Small",
    weights: str | None = None,
    input_size: int | Sequence[int] | None = None,
    input_scale: float = 255.0,
    preprocess: bool = True,
    pooling: str = "avg",
    dropout: float = 0.0,
    options: Mapping[str, Any] | None = None,
) -> keras.Model:
    """A `keras.applications` constructor by `name` as the backbone, with a head for the task.

    Args:
      name: the constructor in `keras.applications` (`available_names()`).
      weights: None (random), "imagenet" (the file Keras downloads, which must be in its cache
        already: nothing is downloaded during a run), or the path of a weights file.
      input_size: the backbone's image size (an int: square; [height, width]); None: the
        dataset's own size. Images are resized to it inside the model.
      input_scale: what the model's inputs are multiplied by to reach the [0, 255] pixels the
        applications expect: 255 for the pipeline's default `normalize: scale`, 1 for raw pixels.
      preprocess: apply the application's own `preprocess_input` (false: feed it the scaled
        pixels).
      pooling: "avg" or "max", the global pooling between backbone and head.
      dropout: the dropout rate before the head (0: none).
      options: further keyword arguments of the constructor (`alpha`, `minimalistic`, ...).

    Raises:
      ConfigError: an unknown name, options or weights the constructor rejects, or
        `weights="imagenet"` without the file in Keras' cache.
    """
    _require_image(input_shape, "keras_app")
    constructor = _constructor(name)
    size = _image_size(input_size, input_shape)
    inputs = keras.Input(shape=tuple(input_shape))
    x = _preprocessed(inputs, input_shape, size, name, scale=input_scale, preprocess=preprocess)
    x = _backbone(constructor, name, size=size, weights=weights, options=options or {})(x)
    return keras.Model(inputs, _head(x, pooling, dropout, num_outputs), name="keras_app")


def _preprocessed(
    inputs: keras.KerasTensor,
    input_shape: Sequence[int],
    size: tuple[int, int],
    name: str,
    *,
    scale: float,
    preprocess: bool,
) -> keras.KerasTensor:
    """The images resized to the backbone's `size` (where they differ) and mapped to the pixels
    application `name` expects."""
    x = inputs
    if tuple(input_shape[:2]) != size:
        x = layers.Resizing(*size, name="resize")(x)
    transform = _pixel_transform(name, input_shape[-1], scale=scale, preprocess=preprocess)
    return _affine_channels(transform, name="preprocess")(x)


def _head(
    features: keras.KerasTensor, pooling: str, dropout: float, num_outputs: int
) -> keras.KerasTensor:
    """Global pooling of the backbone's feature maps, dropout and the task's logits."""
    if pooling not in ("avg", "max"):
        raise ConfigError(Problem("model.pooling", pooling, "expected avg or max"))
    pool = layers.GlobalAveragePooling2D if pooling == "avg" else layers.GlobalMaxPooling2D
    x = pool(name="pool")(features)
    if dropout:
        x = layers.Dropout(dropout, name="dropout")(x)
    return _logits(x, num_outputs)


@functools.cache
def _applications() -> dict[str, tuple[Callable[..., keras.Model], Callable]]:
    """Every public constructor of `keras.applications`, with `preprocess_input` of the public
    module named like the one it is defined in (ResNet50: keras.applications.resnet)."""
    found = {}
    for name in filter(str.isidentifier, dir(keras.applications)):
        constructor = getattr(keras.applications, name)
        if not (name[:1].isupper() and inspect.isfunction(constructor)):
            continue
        module = getattr(keras.applications, constructor.__module__.rpartition(".")[2], None)
        if hasattr(module, "preprocess_input"):
            found[name] = (constructor, module.preprocess_input)
    return found


def available_names() -> list[str]:
    """The names `model.name` may take."""
    return sorted(_applications())


def _constructor(name: str) -> Callable[..., keras.Model]:
    if name not in _applications():
        raise ConfigError(
            Problem(
                "model.name",
                name,
                f"not a keras.applications model; available: {', '.join(available_names())}",
            )
        )
    return _applications()[name][0]


def _image_size(input_size: int | Sequence[int] | None, input_shape: Sequence[int]):
    if input_size is None:
        return tuple(input_shape[:2])
    size = [input_size] * 2 if isinstance(input_size, int) else list(input_size)
    if len(size) != 2 or not all(isinstance(s, int) and s > 0 for s in size):
        raise ConfigError(
            Problem("model.input_size", input_size, "expected a size N or [height, width] or null")
        )
    return tuple(size)


# --- the application's preprocessing as a layer ---------------------------------------------------
def _pixel_transform(name: str, channels: int, *, scale: float, preprocess: bool):
    """(kernel [channels, 3], bias [3]): the model's inputs -> what the backbone expects.

    Every `preprocess_input` of keras.applications is affine per pixel (scale, mean and std per
    channel, RGB->BGR for the caffe ones, identity where the model normalizes itself), so it is
    measured on probe pixels and becomes one fixed 1x1 convolution: a built-in layer, so the
    exported model.keras loads anywhere without tfrecipe. Grey images (1 channel) are repeated to
    the 3 channels every application expects by the same kernel.
    """
    if channels not in (1, 3):
        raise ConfigError(
            Problem(
                "dataset", hint=f"model=keras_app takes 1 or 3 channel images, received {channels}"
            )
        )
    fn = _applications()[name][1] if preprocess else lambda pixels: pixels
    bias = _apply(fn, np.zeros(3))
    columns = np.stack([_apply(fn, 255.0 * np.eye(3)[i]) - bias for i in range(3)], axis=1) / 255.0
    probe = np.random.default_rng(0).uniform(0, 255, size=3)
    if not np.allclose(_apply(fn, probe), columns @ probe + bias, rtol=1e-4, atol=1e-3):
        raise ConfigError(
            Problem(
                "model.preprocess",
                preprocess,
                f"{name}'s preprocess_input is not a per-pixel affine map; set "
                "model.preprocess=false and preprocess in the dataset",
            )
        )
    kernel = scale * columns.T  # [in=3, out=3]
    if channels == 1:
        kernel = kernel.sum(axis=0, keepdims=True)  # grey: the same value in every channel
    return kernel.astype("float32"), bias.astype("float32")


def _apply(fn: Callable, pixel: np.ndarray) -> np.ndarray:
    return np.asarray(fn(np.array(pixel, dtype="float32").reshape(1, 1, 1, 3)), "float64").ravel()


def _affine_channels(transform, *, name: str) -> layers.Layer:
    kernel, bias = transform
    # float32: mean subtraction in half precision would lose the pixels' low bits.
    layer = layers.Conv2D(3, 1, trainable=False, dtype="float32", name=name)
    layer.build((None, None, None, kernel.shape[0]))
    layer.set_weights([kernel.reshape(1, 1, *kernel.shape), bias])
    return layer


# --- the backbone ---------------------------------------------------------------------------------
def _backbone(constructor, name: str, *, size, weights: str | None, options) -> keras.Model:
    _check_weights(weights)
    kwargs = {**options, "include_top": False, "weights": weights, "input_shape": (*size, 3)}
    try:
        with _only_cached_downloads():
            backbone = constructor(**kwargs)
    except _NotInCache as missing:
        raise ConfigError(
            Problem(
                "model.weights",
                weights,
                f"{name}'s ImageNet weights are not in Keras' cache and nothing is downloaded "
                f"during a run: put {missing.fname} in {missing.directory} (download it from "
                f"{missing.origin}) or pass its path as model.weights=PATH",
            )
        ) from None
    except TypeError as error:  # an option the constructor does not take
        accepted = sorted(set(inspect.signature(constructor).parameters) - set(kwargs))
        raise ConfigError(
            Problem(
                "model.options",
                dict(options),
                f"{name} rejects them ({error}); its options: {', '.join(accepted)}",
            )
        ) from None
    except ValueError as error:  # a value it rejects (a size below its minimum, ...)
        message = " ".join(str(error).split())
        raise ConfigError(Problem("model", hint=f"{name}: {message}")) from None
    backbone.name = BACKBONE
    return backbone


def _check_weights(weights: str | None) -> None:
    if weights in (None, "imagenet") or Path(weights).is_file():
        return
    raise ConfigError(
        Problem(
            "model.weights",
            weights,
            "expected null (random), imagenet, or the path of an existing weights file",
        )
    )


class _NotInCache(Exception):
    def __init__(self, fname: str, directory: Path, origin: str):
        super().__init__(fname)
        self.fname, self.directory, self.origin = fname, directory, origin


def keras_cache_dir(cache_subdir: str = "models", cache_dir: str | None = None) -> Path:
    """Where `keras.utils.get_file` keeps a file (KERAS_HOME, else ~/.keras; /tmp/.keras when
    that is not writable, as get_file decides)."""
    from keras.src.backend import config

    base = Path(os.path.expanduser(cache_dir or config.keras_home()))
    if not os.access(base, os.W_OK):
        base = Path("/tmp/.keras")
    return base / cache_subdir


@contextlib.contextmanager
def _only_cached_downloads() -> Iterator[None]:
    """keras.applications fetch their weights with `file_utils.get_file`, which downloads when
    the file is not cached (and, without a network, fails with a traceback after a wait). Here a
    file that is not in the cache raises `_NotInCache` instead, naming the file it looked for."""
    from keras.src.utils import file_utils

    real = file_utils.get_file

    def cached_only(fname=None, origin=None, *args, cache_subdir="datasets", cache_dir=None, **kw):
        where = keras_cache_dir(cache_subdir, cache_dir)
        if not (where / fname).is_file():
            raise _NotInCache(fname, where, origin)
        return real(fname, origin, *args, cache_subdir=cache_subdir, cache_dir=cache_dir, **kw)

    file_utils.get_file = cached_only
    try:
        yield
    finally:
        file_utils.get_file = real


__all__ = ["available_names", "keras_app", "keras_cache_dir"]
