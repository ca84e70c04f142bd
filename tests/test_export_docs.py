"""docs/using_a_model.md's snippet that calls the ONNX and LiteRT files, run as written on a run
that exported both: its input name, LiteRT's batch-1 input resized, and the logits match the
Keras model's on the same (scaled) inputs (issue 49, item 10)."""

from __future__ import annotations

from conftest import REPO

PAGE = REPO / "docs" / "using_a_model.md"


def test_the_export_runtimes_snippet_runs_and_matches_keras(train_run):
    import keras
    import numpy as np

    _, run_dir = train_run("model=mlp", "export.formats=[keras,onnx,litert]")
    text = PAGE.read_text()
    snippet = text.split("<!-- export-runtimes-snippet -->")[1].split("```python")[1]
    snippet = snippet.split("```")[0]
    assert 'run = "outputs/digits"' in snippet
    namespace: dict = {}
    exec(snippet.replace('run = "outputs/digits"', f"run = {str(run_dir)!r}"), namespace)
    assert namespace["name"] == namespace["session"].get_inputs()[0].name
    keras_logits = keras.saving.load_model(run_dir / "model.keras").predict(
        namespace["x"], verbose=0
    )
    np.testing.assert_allclose(namespace["onnx_logits"], keras_logits, atol=1e-4)
    np.testing.assert_allclose(namespace["litert_logits"], keras_logits, atol=1e-4)
    assert namespace["litert_logits"].shape == (4, 10)
