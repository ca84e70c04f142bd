"""`tfrecipe serve RUN_DIR`: TF Serving's REST API for a run's model, tried with a real HTTP
client (urllib) against the real server process on loopback: its answers equal the run's
SavedModel, bad requests get predict's line as a 400, and SIGTERM/Ctrl-C stop it at once."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, TINY

pytest.importorskip("uvicorn", reason="the serve extra: pip install 'tfrecipe[serve]'")

pytestmark = pytest.mark.heavy  # trains (module fixtures) and starts servers

CUSTOMERS = REPO / "tests" / "data" / "customers.csv"
COLUMNS = ["age", "income", "visits", "city", "plan"]
START_UP = re.compile(r"at (http://\S+/v1/models/\S+)")


def _train(tmp_path_factory, name: str, *overrides: str) -> Path:
    from tfrecipe.config.compose import compose
    from tfrecipe.train import train

    run_dir = tmp_path_factory.mktemp(name) / "run"
    train(compose([*TINY, "export.formats=[keras,saved_model]", *overrides]), run_dir=run_dir)
    return run_dir


class Server:
    """`python -m tfrecipe serve ...` in its own process, ready once its start-up line came."""

    def __init__(self, *args: str, cwd: Path):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tfrecipe", "serve", *args, "--port", "0"],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        # a server that never comes up fails the test instead of hanging it
        self._timer = threading.Timer(300, self.process.kill)
        self._timer.start()
        self.lines = [self.process.stdout.readline()]
        found = START_UP.search(self.lines[0])
        assert found, (self.lines, self.process.stderr.read() if self.process.poll() else "")
        self.url = found.group(1)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Sends `sig`; the exit code, which must come within 2 s."""
        self.process.send_signal(sig)
        code = self.process.wait(timeout=2)
        self._timer.cancel()
        return code

    def close(self) -> None:
        self._timer.cancel()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _call(url: str, body: bytes | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _post(server: Server, payload: dict, name: str | None = None) -> tuple[int, dict]:
    url = server.url if name is None else server.url.rsplit("/", 1)[0] + f"/{name}"
    return _call(url + ":predict", json.dumps(payload).encode())


def _files(run_dir: Path) -> dict[str, float]:
    return {str(p.relative_to(run_dir)): p.stat().st_mtime for p in run_dir.rglob("*")}


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    run_dir = _train(
        tmp_path_factory, "digits", "model=cnn", "model.filters=[4]", "model.dense_units=8"
    )
    before = _files(run_dir)
    server = Server(str(run_dir), "--name", "digits", cwd=run_dir.parent)
    yield run_dir, server
    server.close()
    assert _files(run_dir) == before, "the server wrote into the run dir"


@pytest.fixture(scope="module")
def customers(tmp_path_factory):
    run_dir = _train(
        tmp_path_factory,
        "customers",
        "model=mlp",
        "model.hidden_units=[16]",
        "dataset=csv",
        f"dataset.path={CUSTOMERS}",
        "dataset.label=churned",
        f"dataset.features=[{','.join(COLUMNS)}]",
        "dataset.categorical=[city,plan]",
        "task=binary",
    )
    server = Server(str(run_dir), "--host", "0.0.0.0", cwd=run_dir.parent)
    server.url = server.url.replace("0.0.0.0", "127.0.0.1")
    yield run_dir, server
    server.close()


def _saved_model(run_dir: Path):
    import tensorflow as tf

    loaded = tf.saved_model.load(str(run_dir / "saved_model"))  # kept: serve needs it
    return lambda x: np.asarray(
        loaded.serve(
            {k: tf.constant(v) for k, v in x.items()} if isinstance(x, dict) else tf.constant(x)
        )
    )


def _digits_images(count: int) -> np.ndarray:
    from sklearn.datasets import load_digits

    images = (load_digits().images[-count:] / 16.0).astype("float32")
    return images[..., np.newaxis]


def test_status_and_metadata_are_tf_servings(digits):
    run_dir, server = digits
    assert _call(server.url) == (
        200,
        {
            "model_version_status": [
                {
                    "version": "1",
                    "state": "AVAILABLE",
                    "status": {"error_code": "OK", "error_message": ""},
                }
            ]
        },
    )
    tried = re.search(r"curl -s (\S+) -d '(.+)'", server.process.stdout.readline())
    assert tried.group(1) == server.url + ":predict"  # the start-up line's request works
    assert _call(server.url + ":predict", tried.group(2).encode())[0] == 200
    status, metadata = _call(server.url + "/metadata")
    assert status == 200
    assert metadata["tfrecipe"] == json.loads((run_dir / "signature.json").read_text())
    signature = metadata["metadata"]["signature_def"]["signature_def"]["serving_default"]
    (spec,) = signature["inputs"].values()
    assert spec["dtype"] == "DT_FLOAT"
    assert [int(d["size"]) for d in spec["tensor_shape"]["dim"]] == [-1, 8, 8, 1]


def test_256_images_in_concurrent_requests_equal_the_saved_model(digits):
    run_dir, server = digits
    images = _digits_images(256)
    chunks = np.split(images, 16)  # 16 requests of 16 at once: batched, each its own rows back
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda x: _post(server, {"instances": x.tolist()}), chunks))
    assert all(status == 200 for status, _ in answers)
    served = np.concatenate([np.asarray(answer["predictions"]) for _, answer in answers])
    expected = _saved_model(run_dir)(images)
    assert served.shape == expected.shape == (256, 10)
    np.testing.assert_allclose(served, expected, atol=1e-5, rtol=0)
    decoded = [row for _, answer in answers for row in answer["decoded"]]
    assert [row["prediction"] for row in decoded] == [str(i) for i in expected.argmax(axis=1)]

    status, columnar = _post(server, {"inputs": images[:5].tolist()})
    assert status == 200 and set(columnar) == {"outputs", "decoded"}
    np.testing.assert_allclose(columnar["outputs"], expected[:5], atol=1e-5, rtol=0)


def test_bad_requests_get_predicts_line_as_400_and_the_server_lives_on(digits):
    _, server = digits
    nan = _digits_images(2)
    nan[1, 3, 4, 0] = np.nan
    status, answer = _post(server, {"instances": nan.tolist()})
    assert status == 400 and "non-finite" in answer["error"] and "[1, 3, 4, 0]" in answer["error"]
    status, answer = _post(server, {"instances": [[1.0, 2.0]]})
    assert (status, answer["error"]) == (
        400,
        "predict: instances: examples of shape [2], the model takes [8, 8, 1]",
    )
    assert _call(server.url + ":predict", b"{not json")[0] == 400
    assert _post(server, {"rows": []})[0] == 400
    status, answer = _post(server, {"instances": []}, name="other")
    assert status == 404 and "'other'" in answer["error"]
    status, answer = _post(server, {"instances": [], "signature_name": "predict"})
    assert (status, answer["error"]) == (
        400,
        "signature_name: 'predict' is not served here; the model serves 'serving_default'",
    )
    for url in (server.url, server.url + "/versions/1"):  # a GET of predict, as TF Serving
        status, answer = _call(url + ":predict")
        assert status == 405 and "takes POST" in answer["error"], (url, status, answer)
    assert _call(server.url + ":predict", b" " * (64 * 1024**2))[0] == 413  # 64 MB
    assert _post(server, {"instances": _digits_images(1).tolist()})[0] == 200  # still serving


def test_a_request_of_no_examples_says_so(digits):
    """`{"instances": []}` to an image model was answered "examples of shape [], the model
    takes [8, 8, 1]", as though the client had sent a wrongly shaped example."""
    _, server = digits
    for fmt in ("instances", "inputs"):
        status, answer = _post(server, {fmt: []})
        assert (status, answer["error"]) == (400, f'"{fmt}" holds no examples'), answer


def test_an_endpoint_not_served_is_refused_in_json(digits):
    """TF Serving's :classify and :regress, a version label, a POST of metadata, the root: each
    was Starlette's plain-text "Not Found" or "Method Not Allowed", which a TF Serving client
    reading the answer's JSON "error" fails to parse."""
    _, server = digits
    root, path = server.url.split("/v1/")[0], "/v1/" + server.url.split("/v1/")[1]
    refused = [
        (server.url + ":classify", b"{}", 405),
        (server.url + ":regress", b"{}", 405),
        (server.url + "/metadata", b"{}", 405),
        (server.url + "/labels/stable:predict", b"{}", 404),
        (root + "/", None, 404),
    ]
    for url, body, code in refused:
        status, answer = _call(url, body)
        assert status == code, (url, status, answer)
        assert answer["error"].endswith(
            f"this server answers GET {path}, GET {path}/metadata and POST {path}:predict"
        ), (url, answer)


def test_bodies_past_what_json_or_floats_carry_get_400_and_the_server_lives_on(digits):
    """A body nested past Python's recursion limit and an integer past float64 are bad requests
    (they were 500 Internal Server Error, with a traceback in the server's log), and so is a
    boolean where a number goes (it was scored as 1)."""
    _, server = digits
    deep = b'{"instances":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, answer = _call(server.url + ":predict", deep)
    assert status == 400 and "nests its lists or objects too deeply" in answer["error"]
    image = _digits_images(1).tolist()
    image[0][3][4][0] = 10**400  # JSON carries it as an integer of 401 digits
    status, answer = _post(server, {"instances": image})
    assert status == 400 and "examples must be arrays of numbers" in answer["error"]
    image[0][3][4][0] = True  # TF Serving refuses a boolean in a float tensor; numpy takes 1.0
    status, answer = _post(server, {"instances": image})
    assert status == 400 and "(got true, a boolean)" in answer["error"], answer
    assert _post(server, {"instances": _digits_images(1).tolist()})[0] == 200  # still serving


def test_outputs_past_float32_come_back_as_tf_serving_writes_them(digits):
    """Finite inputs far out of the training range can overflow the model's outputs: they are
    answered as the SavedModel gives them, NaN and Infinity written as TF Serving writes them
    (bare tokens, which Python's json reads), not a 500."""
    run_dir, server = digits
    saved_model = _saved_model(run_dir)
    candidates = [
        np.full((1, 8, 8, 1), sign * scale, np.float32)
        for scale in (1e38, 3e38)
        for sign in (1, -1)
    ]
    overflowing = [x for x in candidates if not np.isfinite(saved_model(x)).all()]
    assert overflowing, "no input overflows this model's outputs: pick larger ones"
    status, answer = _post(server, {"instances": overflowing[0].tolist()})
    assert status == 200, answer
    np.testing.assert_allclose(answer["predictions"], saved_model(overflowing[0]), rtol=1e-5)
    assert not np.isfinite(answer["predictions"]).all()


def test_a_tables_raw_rows_are_taken_as_predict_takes_them(customers):
    run_dir, server = customers
    assert "listening on 0.0.0.0, as --host asked" in server.process.stdout.readline()
    with open(CUSTOMERS, newline="") as f:
        rows = list(csv.DictReader(f))[:64]  # strings as the CSV has them, the label kept in
    status, answer = _post(server, {"instances": rows})
    assert status == 200, answer
    columns = {
        n: np.array([r[n] for r in rows], dtype=object if n in ("city", "plan") else "float32")
        for n in COLUMNS
    }
    expected = _saved_model(run_dir)(columns)
    np.testing.assert_allclose(answer["predictions"], expected, atol=1e-5, rtol=0)
    chosen = np.where(1 / (1 + np.exp(-expected[:, 0])) >= 0.5, "yes", "no")
    assert [row["prediction"] for row in answer["decoded"]] == chosen.tolist()

    numbers = {
        n: [float(r[n]) if n not in ("city", "plan") else r[n] for r in rows] for n in COLUMNS
    }
    status, columnar = _post(server, {"inputs": numbers})
    np.testing.assert_allclose(columnar["outputs"], expected, atol=1e-5, rtol=0)


def test_a_bad_cell_or_a_missing_column_is_predicts_own_line(customers):
    _, server = customers
    row = {"age": "41", "income": "lots", "visits": "3", "city": "Oslo", "plan": "pro"}
    status, answer = _post(server, {"instances": [row]})
    assert status == 400
    assert answer["error"].startswith(
        "predict: instances[0]: column 'income': 'lots' is not a number; the run's model takes a "
        "number (float32) in this column"
    )
    del row["income"]
    status, answer = _post(server, {"instances": [row]})
    assert (status, answer["error"]) == (
        400,
        "predict: instances[0]: missing the model's column(s) income; the model takes "
        "age, income, visits, city, plan",
    )
    status, answer = _post(server, {"inputs": {**{n: [1.0] for n in COLUMNS}, "age": ["Inf"]}})
    assert status == 400 and "column 'age': 'Inf' is not a finite number" in answer["error"]
    # a category is text, as in a CSV: an object or a list is no unknown category, but refused
    status, answer = _post(server, {"instances": [{**row, "income": "1", "city": {"n": "Oslo"}}]})
    assert (status, answer["error"]) == (
        400,
        "predict: instances[0]: column 'city': a cell is a string or a number, got an object",
    )


def test_sigterm_stops_the_server_within_2_s(customers):
    _, server = customers
    assert server.stop(signal.SIGTERM) == 0
    assert "stopped (SIGTERM)" in server.process.stderr.read()


def test_ctrl_c_stops_the_server_within_2_s(digits):
    _, server = digits
    assert server.stop(signal.SIGINT) == 0
    assert "stopped (SIGINT)" in server.process.stderr.read()


def test_answers_leave_at_once_on_a_keep_alive_connection():
    """The listening socket is TCP's own (proto 6), so asyncio turns Nagle off on each
    connection: with proto 0 a keep-alive client waited 40 ms (delayed ACK) for every answer."""
    from tfrecipe.cli.serve import bind

    sock = bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()
