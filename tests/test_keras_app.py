"""model=keras_app (a keras.applications backbone) and model.freeze, for real on the digits.

The backbone is the smallest application (MobileNetV3Small, alpha 0.75, minimalistic) at 32x32,
random weights: seconds per run, the same code paths as ImageNet weights at 224x224.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

SMALL_APP = [
    "model=keras_app",
    "model.input_size=32",
    "+model.options.alpha=0.75",
    "+model.options.minimalistic=true",
]


def _snapshot(path) -> list[str]:
    return [
        "allowed_targets=[helpers]",
        "+callbacks.extra.snap._target_=helpers.weight_snapshot.WeightSnapshot",
        f"+callbacks.extra.snap.path={path}",
    ]


def _moved(begin, end, layer: str) -> list[bool]:
    keys = [k for k in begin.files if k.startswith(f"{layer}/")]
    assert keys, f"no weights of {layer}"
    return [not np.array_equal(begin[k], end[k]) for k in keys]


# --- training with a frozen backbone, unfrozen at epoch 2, and the model it exports -------------
# Mirrored traces every step for two replicas: the slow tier (the default runs cover the code).
@pytest.mark.parametrize(
    ("loop", "strategy"),
    [
        ("fit", "default"),
        ("custom", "default"),
        pytest.param("fit", "mirrored", marks=pytest.mark.slow),
        pytest.param("custom", "mirrored", marks=pytest.mark.slow),
    ],
)
def test_a_frozen_backbone_keeps_its_weights_until_unfrozen_at_epoch_2(
    train_run, tmp_path, loop, strategy
):
    """Epochs 0 and 1 train the head only; from epoch 2 (loop.finetune.unfreeze_at_epoch) the
    backbone's convolutions train too, at a tenth of the rate."""
    snap = tmp_path / "snap"
    summary, run_dir = train_run(
        *SMALL_APP,
        "model.freeze=backbone",
        "model.freeze_random=true",  # the code path is the same with ImageNet weights
        "loop.epochs=3",
        "loop.finetune.unfreeze_at_epoch=2",
        f"loop={loop}",
        f"strategy={strategy}",
        *(["strategy.logical_cpus=2"] if strategy == "mirrored" else []),
        *_snapshot(snap),
    )
    assert summary["status"] == "completed"
    assert summary["num_replicas"] == (2 if strategy == "mirrored" else 1)
    begin, second, end = (np.load(snap / f"{name}.npz") for name in ("begin", "epoch1", "end"))
    # Phase one: every backbone tensor stays, BatchNormalization's moving statistics included
    # (inference mode); the head learns.
    assert not any(_moved(begin, second, "backbone"))
    assert all(_moved(begin, second, "logits"))
    head = end["logits/0"].size + end["logits/1"].size
    record = summary["finetune"]
    assert record["trainable_params"]["before"] == head < summary["params"]["total"]
    # Phase two: every convolution kernel trains; BatchNormalization (its 1-D weights) stays
    # frozen in inference mode, as the Keras fine-tuning guide says.
    kernels = [k for k in end.files if k.startswith("backbone/") and end[k].ndim == 4]
    norms = [k for k in end.files if k.startswith("backbone/") and end[k].ndim == 1]
    assert kernels and all(not np.array_equal(second[k], end[k]) for k in kernels)
    assert norms and all(np.array_equal(second[k], end[k]) for k in norms)
    assert record["unfroze_at_step"] == 2 * 3  # TINY: 3 steps per epoch
    assert record["trainable_params"]["after"] > record["trainable_params"]["before"]
    assert summary["params"]["trainable"] == record["trainable_params"]["after"]  # phase two's
    assert record["learning_rate"] == pytest.approx(summary["learning_rate"] * 0.1)
    _check_the_export_takes_raw_digits(run_dir)


def _check_the_export_takes_raw_digits(run_dir) -> None:
    """A plain Keras load (safe mode, no custom objects): the resize and the application's
    preprocessing are built-in layers inside the model, which takes the pipeline's images."""
    import keras
    from sklearn.datasets import load_digits

    model = keras.saving.load_model(run_dir / "model.keras")
    images = (load_digits().images / 16.0).astype("float32")[..., None]  # as the pipeline gives
    logits = model.predict(images[:32], verbose=0)
    assert logits.shape == (32, 10) and np.isfinite(logits).all()
    assert model.get_layer("backbone").input.shape[1:] == (32, 32, 3)


# --- errors before training: exit 2, one line, no run dir -------------------------------------
def test_imagenet_weights_offline_name_the_file_and_where_it_goes(cli, tmp_path):
    keras_home = tmp_path / "keras_home"
    keras_home.mkdir()
    run_dir = tmp_path / "run"
    result = cli(
        "model=keras_app",
        "model.weights=imagenet",
        f"hydra.run.dir={run_dir}",
        env={"KERAS_HOME": str(keras_home)},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if "model.weights" in line]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "weights_mobilenet_v3_small_224_1.0_float_no_top_v2.h5" in errors[0]
    assert str(keras_home / "models") in errors[0]
    assert not run_dir.exists()


def test_an_unknown_application_lists_the_names(cli, tmp_path):
    run_dir = tmp_path / "run"
    result = cli("model=keras_app", "model.name=MobileNetV9", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2, result.stderr[-2000:]
    (line,) = [line for line in result.stderr.splitlines() if "model.name" in line]
    assert "MobileNetV9" in line and "MobileNetV3Small" in line and "ResNet50" in line
    assert "Traceback" not in result.stderr and not run_dir.exists()


def test_options_the_constructor_rejects_are_named():
    from tfrecipe.errors import ConfigError
    from tfrecipe.models import keras_app

    with pytest.raises(ConfigError, match=r"model.options=.*beta.*its options: alpha"):
        keras_app(input_shape=(8, 8, 1), num_outputs=3, input_size=32, options={"beta": 2})
    with pytest.raises(ConfigError, match="at least 32x32"):
        keras_app(input_shape=(8, 8, 1), num_outputs=3, input_size=16)


# --- what each freeze spec freezes ------------------------------------------------------------
@pytest.fixture(scope="module")
def build():
    def _build(**options):
        from tfrecipe.models import keras_app

        return keras_app(
            input_shape=(8, 8, 1),
            num_outputs=10,
            input_size=32,
            options={"alpha": 0.75, "minimalistic": True},
            **options,
        )

    return _build


def test_fraction_freezes_the_first_layers_of_the_backbone(build):
    from tfrecipe.models import freeze

    model = build()
    layers = model.get_layer("backbone").layers
    frozen = freeze.apply(model, "fraction:0.5")
    assert frozen == [layer.name for layer in layers[: len(layers) // 2]]
    assert [layer.trainable for layer in layers] == [
        i >= len(layers) // 2 for i in range(len(layers))
    ]
    assert model.get_layer("logits").trainable


def test_a_regex_freezes_the_layers_it_names(build):
    from tfrecipe.models import freeze

    model = build()
    before = freeze.param_counts(model)["trainable"]
    sizes = {
        layer.name: sum(int(np.prod(w.shape)) for w in layer.trainable_weights)
        for layer in freeze.all_layers(model)
    }
    frozen = freeze.apply(model, r"^expanded_conv_1_")
    assert set(frozen) == {name for name in sizes if name.startswith("expanded_conv_1_")}
    assert freeze.param_counts(model)["trainable"] == before - sum(map(sizes.get, frozen)) < before


def test_freeze_specs_that_name_nothing_are_refused(build):
    from tfrecipe.errors import ConfigError
    from tfrecipe.models import freeze

    with pytest.raises(ConfigError, match=r"model.freeze='\^nothing\$': matches no layer"):
        freeze.apply(build(), "^nothing$")
    with pytest.raises(ConfigError, match=r"model.freeze=fraction:1.5"):
        freeze.apply(build(), "fraction:1.5")


def test_a_bad_freeze_value_stops_validation(compose_cfg):
    from tests.helpers.configs import validate
    from tfrecipe.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model.freeze=fraction:x"):
        validate(compose_cfg("model=cnn", "model.freeze=fraction:x"))


@pytest.mark.parametrize(
    ("overrides", "allowed"),
    [
        (["model=keras_app"], "model.weights=imagenet|PATH or model.init_from=RUN_DIR"),
        (["model=cnn"], "model.init_from=RUN_DIR"),  # no model.weights to pass
    ],
)
def test_freezing_random_weights_is_refused_before_anything_is_written(
    cli, tmp_path, overrides, allowed
):
    """Frozen random weights never learn (a random MobileNetV3Small trained at chance, silently):
    exit 2 naming what to pass, before a run dir exists; explicit trained weights or
    model.freeze_random=true pass validation."""
    run_dir = tmp_path / "run"
    result = cli(*overrides, "model.freeze=backbone", f"hydra.run.dir={run_dir}")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        "tfrecipe: invalid configuration: model.freeze=backbone: freezes randomly initialized "
        f"weights (nothing trained to start from), which then never learn; pass {allowed}, or "
        "model.freeze_random=true to freeze them anyway"
    ]
    assert not run_dir.exists()


@pytest.mark.parametrize(
    "overrides",
    [
        ["model=keras_app", "model.weights=imagenet"],
        ["model=cnn", "model.init_from=outputs/pretrained"],
        ["model=cnn", "model.freeze_random=true"],
    ],
)
def test_freezing_trained_weights_or_on_purpose_validates(compose_cfg, overrides):
    from tests.helpers.configs import validate

    validate(compose_cfg(*overrides, "model.freeze=backbone"))  # raises on a problem


def test_backbone_of_a_small_builder_is_everything_but_the_head(train_run):
    summary, _ = train_run(
        "model=cnn", "model.filters=[8]", "model.freeze=backbone", "model.freeze_random=true"
    )
    assert summary["params"]["trainable"] == 128 * 10 + 10  # the 10-class head on 128 units


def test_unfreeze_trains_again_what_freeze_froze_but_the_fixed_preprocessing(build):
    import keras

    from tfrecipe.models import freeze

    model = build()
    total = freeze.param_counts(model)["total"]
    freeze.apply(model, "backbone")
    freeze.unfreeze(model, r"^expanded_conv_2_")
    backbone = model.get_layer("backbone")
    assert backbone.trainable
    assert {layer.name for layer in backbone.layers if layer.trainable} >= {
        layer.name
        for layer in backbone.layers
        if layer.name.startswith("expanded_conv_2_")
        and layer.weights
        and not isinstance(layer, keras.layers.BatchNormalization)
    }
    freeze.unfreeze(model)
    assert not model.get_layer("preprocess").trainable
    batch_norm = sum(
        math.prod(w.shape)
        for layer in freeze.all_layers(model)
        if isinstance(layer, keras.layers.BatchNormalization)
        for w in layer.weights
    )
    preprocess = sum(math.prod(w.shape) for w in model.get_layer("preprocess").weights)
    assert freeze.param_counts(model)["trainable"] == total - batch_norm - preprocess


# --- the application's preprocessing, inside the model ----------------------------------------
@pytest.mark.parametrize("name", ["MobileNetV2", "ResNet50", "DenseNet121"])
def test_the_preprocessing_is_the_applications_own(name):
    import keras

    from tfrecipe.models.keras_app import _pixel_transform

    app = getattr(
        keras.applications,
        {"MobileNetV2": "mobilenet_v2", "ResNet50": "resnet", "DenseNet121": "densenet"}[name],
    )
    kernel, bias = _pixel_transform(name, 3, scale=255.0, preprocess=True)
    images = np.random.default_rng(0).uniform(0, 1, (4, 5, 5, 3)).astype("float32")
    expected = app.preprocess_input(images * 255.0)
    np.testing.assert_allclose(images @ kernel + bias, expected, rtol=1e-5, atol=1e-4)
    grey_kernel, _ = _pixel_transform(name, 1, scale=255.0, preprocess=True)
    grey = images[..., :1]
    np.testing.assert_allclose(
        grey @ grey_kernel + bias, app.preprocess_input(np.repeat(grey, 3, -1) * 255.0), atol=1e-4
    )
