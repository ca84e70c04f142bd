"""Text: `dataset=text_folder` and TFDS text sets with `model=text` (a TextVectorization adapted
on the training split inside the model), trained for seconds on corpora the tests generate."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY

# Each class has its own words; every text also holds words both classes share.
CLASS_WORDS = {
    "neg": ["awful", "boring", "terrible", "dull", "waste", "bad", "poor", "clumsy"],
    "pos": ["great", "superb", "lovely", "brilliant", "fun", "good", "wonderful", "witty"],
    "mixed": ["odd", "strange", "long", "quiet", "slow", "plain", "grey", "loud"],
}
NOISE = ["the", "a", "movie", "film", "plot", "actor", "scene", "and", "it", "was", "of", "story"]
# A small, quick model: the corpus has about 40 distinct words.
SMALL_TEXT = [
    "model=text",
    "model.vocabulary_size=100",
    "model.sequence_length=16",
    "model.embedding_dim=8",
]


def write_corpus(root: Path, *, classes=("neg", "pos"), per_class: int = 40, seed: int = 0):
    """root/CLASS/NNN.txt: 3 of the class's words among 8 shared ones, shuffled, punctuated."""
    rng = random.Random(seed)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            words = rng.choices(CLASS_WORDS[name], k=3) + rng.choices(NOISE, k=8)
            rng.shuffle(words)
            (root / name / f"{i:03d}.txt").write_text(" ".join(words).capitalize() + ".")
    return root


def _strings(*texts: str):
    import tensorflow as tf

    return tf.constant(texts)


def test_text_folder_trains_through_the_cli_and_model_keras_takes_raw_strings(cli, tmp_path):
    corpus = write_corpus(tmp_path / "reviews")
    run_dir = tmp_path / "run"
    result = cli(
        "dataset=text_folder",
        f"dataset.path={corpus}",
        "dataset.test_fraction=0.2",
        "task=binary",
        *SMALL_TEXT,
        "loop.epochs=5",
        "loop.verbose=0",
        "batching.per_replica_batch_size=16",
        "optimizer.learning_rate=0.01",
        "export.formats=[keras,saved_model]",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["test"]["accuracy"] >= 0.9, summary["test"]  # chance: 0.5
    assert summary["test"]["auc"] >= 0.95, summary["test"]

    import keras

    from tfrecipe.models.build import register_custom_objects

    register_custom_objects()
    model = keras.saving.load_model(run_dir / "model.keras")
    logits = np.asarray(
        model.predict(_strings("Brilliant, witty fun!", "A dull waste."), verbose=0)
    )
    assert logits.shape == (2, 1)
    assert logits[0, 0] > 0 > logits[1, 0]  # pos (label 1) then neg (label 0)
    # The SavedModel too: its serving signature tokenizes with the same vocabulary.
    import tensorflow as tf

    exported = tf.saved_model.load(str(run_dir / "saved_model"))  # kept: it owns the variables
    served = exported.serve(_strings("Brilliant, witty fun!", "A dull waste."))
    np.testing.assert_allclose(np.asarray(served), logits, rtol=1e-5)


def test_three_classes_train_with_the_conv_encoder_and_the_custom_loop(train_run, tmp_path):
    corpus = write_corpus(tmp_path / "texts", classes=("mixed", "neg", "pos"), per_class=30)
    summary, _ = train_run(
        "dataset=text_folder",
        f"dataset.path={corpus}",
        "dataset.test_fraction=0.2",
        *SMALL_TEXT,
        "model.encoder=conv",
        "model.filters=[8]",
        "model.kernel_size=3",
        "loop=custom",
        "loop.epochs=6",
        "loop.verbose=0",
        "batching.per_replica_batch_size=16",
        "optimizer.learning_rate=0.01",
        tiny=False,
    )
    assert summary["status"] == "completed" and summary["loop"] == "custom"
    assert summary["test"]["accuracy"] >= 0.8, summary["test"]  # chance: 1/3


@pytest.mark.parametrize("loop", ["fit", pytest.param("custom", marks=pytest.mark.slow)])
def test_mirrored_trains_text_as_the_default_strategy_does(train_run, tmp_path, loop):
    """Raw strings split over 2 replicas: the same losses as one replica, within 1e-4."""
    corpus = write_corpus(tmp_path / "reviews")
    same_work = [
        "dataset=text_folder",
        f"dataset.path={corpus}",
        "task=binary",
        *SMALL_TEXT,
        "model.dropout=0.0",
        f"loop={loop}",
        "seed=3",
        "deterministic=true",
        "batching=global",
        "batching.global_batch_size=16",
        "callbacks.model_checkpoint.enabled=false",
        "loop.epochs=2",
        "loop.steps_per_epoch=3",
        "loop.verbose=0",
    ]
    default, _ = train_run(*same_work, tiny=False)
    mirrored, _ = train_run(*same_work, "strategy=mirrored", "strategy.logical_cpus=2", tiny=False)
    assert mirrored["num_replicas"] == 2
    for split in ("metrics", "test"):
        np.testing.assert_allclose(
            mirrored[split]["loss"], default[split]["loss"], rtol=1e-4, err_msg=split
        )


def test_imdb_reviews_from_tfds_trains_with_the_recipe(train_run):
    """The real TFDS loading code on TFDS' mock imdb_reviews (random texts, random labels)."""
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=48):
        summary, run_dir = train_run("recipe=imdb_text_binary", *SMALL_TEXT[1:])
    assert summary["status"] == "completed" and summary["dataset"] == "tfrecipe.data.tfds.load"
    assert summary["steps_completed"] == 6 and np.isfinite(summary["metrics"]["val_loss"])
    assert {"auc", "precision", "recall"} <= set(summary["test"])
    assert (run_dir / "model.keras").is_file()


def test_texts_without_a_token_train_and_predict_finite_numbers(train_run, tmp_path):
    """An empty or punctuation-only text has no token to average: its mean is zeros, not 0/0."""
    corpus = write_corpus(tmp_path / "reviews")
    for name in ("neg", "pos"):
        (corpus / name / "empty.txt").write_text("")
        (corpus / name / "dots.txt").write_text("... !!! ?")
    summary, run_dir = train_run(
        "dataset=text_folder",
        f"dataset.path={corpus}",
        "task=binary",
        *SMALL_TEXT,
        "loop.steps_per_epoch=null",
        "batching.per_replica_batch_size=67",  # all in every step
    )
    assert summary["status"] == "completed"
    assert all(np.isfinite(v) for v in summary["metrics"].values()), summary["metrics"]

    import keras

    from tfrecipe.models.build import register_custom_objects

    register_custom_objects()
    model = keras.saving.load_model(run_dir / "model.keras")
    logits = np.asarray(model.predict(_strings("", "?!", "Brilliant fun"), verbose=0))
    assert np.isfinite(logits).all(), logits


def test_the_vocabulary_does_not_depend_on_the_order_of_the_texts(tmp_path):
    """A resumed run rebuilds its vectorizer from the training split: it must find the same
    vocabulary (the checkpoint holds only the weights indexed by it)."""
    from tfrecipe.data import text_folder
    from tfrecipe.models import text

    train = text_folder.load(path=str(write_corpus(tmp_path / "reviews"))).train
    texts = train.map(lambda x, _: x)

    def vocabulary(features):
        model = text(input_shape=(), num_outputs=1, train_features=features)
        return model.get_layer("vectorizer").get_vocabulary()

    shuffled = texts.shuffle(1000, seed=7)
    assert list(texts.as_numpy_iterator()) != list(shuffled.as_numpy_iterator())
    assert vocabulary(texts) == vocabulary(shuffled) == vocabulary(texts.batch(5).unbatch())
    assert "brilliant" in vocabulary(texts) and "Brilliant" not in vocabulary(texts)


@pytest.mark.slow
def test_a_resumed_text_run_ends_as_an_uninterrupted_one(compose_cfg, tmp_path):
    """Backup mid-epoch, crash, resume: the same vocabulary and bit-for-bit the same weights."""
    from test_backup import BACKUP, _interrupted_at, _weights

    from tfrecipe.train import train

    corpus = write_corpus(tmp_path / "reviews")
    cfg = compose_cfg(
        "dataset=text_folder",
        f"dataset.path={corpus}",
        "task=binary",
        *SMALL_TEXT,
        "deterministic=true",
        *BACKUP,
    )
    run_dir = tmp_path / "run"
    train(cfg, run_dir=run_dir)
    expected = _weights(run_dir)
    vocabulary = _vocabulary(run_dir)
    _interrupted_at(run_dir, 3)
    resumed = train(cfg, run_dir=run_dir)
    assert resumed["resumed_from_step"] == 3 and resumed["steps_completed"] == 10
    assert _vocabulary(run_dir) == vocabulary
    for got, want in zip(_weights(run_dir), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def _vocabulary(run_dir: Path) -> list[str]:
    import keras

    model = keras.saving.load_model(run_dir / "model.keras")
    return model.get_layer("vectorizer").get_vocabulary()


def test_the_pipeline_passes_raw_strings_through_and_refuses_to_augment_them():
    import tensorflow as tf

    from tfrecipe.data.pipeline import PipelineOptions, batch_transform, prepare
    from tfrecipe.errors import ConfigError

    texts = tf.data.Dataset.from_tensor_slices((["Good. Fun!", "dull"], [1, 0]))
    options = PipelineOptions()  # normalize=scale: images only
    prepared = prepare(texts, options, split="train", training=False, seed=0)
    x, y = next(iter(prepared.batch(2).map(batch_transform(options))))
    assert x.dtype == tf.string and list(x.numpy()) == [b"Good. Fun!", b"dull"]
    assert y.dtype == tf.int32
    with pytest.raises(ConfigError, match="augmentation needs images"):
        prepare(texts, PipelineOptions(augment_flip=True), split="train", training=True, seed=0)


# --- bad inputs ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "case", ["missing", "no_classes", "one_class", "empty_class", "too_few_to_split", "latin_1"]
)
def test_bad_text_folders_name_the_folder(case, tmp_path):
    from tfrecipe.data import text_folder

    root = tmp_path / "texts"
    named = root
    if case != "missing":
        root.mkdir()
    if case in ("one_class", "empty_class"):
        write_corpus(root, classes=("neg",), per_class=2)
    if case == "too_few_to_split":  # one text per class cannot give 3 splits
        write_corpus(root, per_class=1)
    if case == "empty_class":
        named = root / "pos"
        named.mkdir()
        (named / "notes.md").write_text("not a .txt file")
    if case == "latin_1":  # its bytes in the vocabulary failed model.keras after training
        write_corpus(root)
        named = root / "neg" / "latin.txt"
        named.write_bytes("un café".encode("latin-1"))
    with pytest.raises(ValueError, match=str(named)) as raised:
        text_folder.load(path=str(root))
    assert "\n" not in str(raised.value)


def test_a_missing_text_folder_exits_2_with_one_line_and_no_run_dir(cli, tmp_path):
    run_dir = tmp_path / "run"
    missing = tmp_path / "nothere"
    result = cli(
        "dataset=text_folder",
        f"dataset.path={missing}",
        "model=text",
        *TINY,
        f"hydra.run.dir={run_dir}",
    )
    _assert_one_line_error(result, "dataset:", str(missing))
    assert not run_dir.exists()


def test_model_text_on_images_is_a_config_error(train_run):
    from tfrecipe.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model=text expects raw text.*input_shape=\[8, 8, 1\]"):
        train_run("model=text")


def test_a_numeric_model_on_text_is_a_config_error(train_run, tmp_path):
    from tfrecipe.errors import ConfigError

    corpus = write_corpus(tmp_path / "reviews", per_class=10)
    with pytest.raises(ConfigError, match=r"gives raw text.*use model=text"):
        train_run("dataset=text_folder", f"dataset.path={corpus}", "model=mlp")


@pytest.mark.slow
def test_model_text_on_images_exits_2_with_one_line(cli, tmp_path):
    run_dir = tmp_path / "run"
    result = cli("model=text", *TINY, f"hydra.run.dir={run_dir}")
    _assert_one_line_error(result, "model:", "model=text expects raw text", "input_shape=[8, 8, 1]")
    assert not run_dir.exists()


def _assert_one_line_error(result, *expected: str) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("tfrecipe:")]
    assert len(lines) == 1, result.stderr[-3000:]
    for text in expected:
        assert text in lines[0], lines[0]
