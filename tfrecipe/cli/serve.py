"""`tfrecipe serve RUN_DIR [--model final|best] [--name NAME] [--host H] [--port P]
[--max-body N]`: a trained run's model behind TF Serving's REST API, to try the requests a
TF Serving (or KServe V1) deployment will answer, on this machine.

GET /v1/models/NAME gives its status (version 1, AVAILABLE), GET /v1/models/NAME/metadata its
signature, POST /v1/models/NAME:predict answers {"instances": [...]} with "predictions" and
{"inputs": {...}} with "outputs", plus "decoded": what `tfrecipe predict` writes (class names,
probabilities). It listens on 127.0.0.1 unless --host names another address. It reads the run
dir through the one reader and writes nothing; SIGTERM or Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tfrecipe.config.export_limits import server_name_problem
from tfrecipe.errors import ConfigError

DEFAULT_NAME = "model"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8501  # TF Serving's REST port
DEFAULT_MAX_BODY = 16 * 1024**2  # bytes: 16 MiB, about 30,000 digits images as JSON
LOOPBACK = ("127.0.0.1", "::1", "localhost")
# TensorFlow's dtype names (signature.json, Keras) -> TF Serving's metadata names.
DT_NAMES = {
    "float32": "DT_FLOAT",
    "float64": "DT_DOUBLE",
    "float16": "DT_HALF",
    "bfloat16": "DT_BFLOAT16",
    "int32": "DT_INT32",
    "int64": "DT_INT64",
    "uint8": "DT_UINT8",
    "bool": "DT_BOOL",
    "string": "DT_STRING",
}


@dataclasses.dataclass(frozen=True)
class Options:
    run_dir: Path
    model: str
    name: str
    host: str
    port: int
    max_body: int


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit code 2, as every usage mistake
        raise ConfigError(f"serve: {message} (tfrecipe serve --help)")


def parse(args: Sequence[str]) -> Options:
    parser = _Parser(prog="tfrecipe serve", description=__doc__.split("\n\n")[1])
    parser.add_argument("run_dir", type=Path, help="a finished run's directory")
    parser.add_argument("--model", default="final", choices=["final", "best"])
    parser.add_argument("--name", default=DEFAULT_NAME, help="the model's name in the URLs")
    parser.add_argument("--host", default=DEFAULT_HOST, help="the address to listen on")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="0: a free port")
    parser.add_argument(
        "--max-body", type=int, default=DEFAULT_MAX_BODY, help="bytes; larger requests get 413"
    )
    options = parser.parse_args(args)
    if server_name_problem(options.name):
        raise ConfigError(f"serve: --name={options.name!r}: {server_name_problem(options.name)}")
    if not 0 <= options.port <= 65535:
        raise ConfigError(f"serve: --port={options.port}: expected 0 (a free port) to 65535")
    if options.max_body <= 0:
        raise ConfigError(f"serve: --max-body={options.max_body}: expected a positive number")
    return Options(**vars(options))


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host`:`port`, bound before the model loads (a taken port is one
    line at once, not after TensorFlow's import)."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
        family, kind, proto, _, address = found[0]
        # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on such sockets' connections;
        # without it a keep-alive client waits 40 ms (delayed ACK) for each answer's body
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)  # requests wait here from the start-up line on (uvicorn accepts them)
    except OSError as error:
        raise ConfigError(
            f"serve: --host={host} --port={port}: cannot listen there ({error.strerror or error})"
        ) from None
    return sock


def metadata(name: str, model, signature: dict[str, Any]) -> dict[str, Any]:
    """TF Serving's metadata answer: the serving signature of the model's inputs and output
    (the SavedModel's `serving_default`), and the run's signature.json under "tfrecipe"."""

    def tensor(spec) -> dict[str, Any]:
        dims = [{"size": str(-1 if n is None else n), "name": ""} for n in spec.shape]
        return {
            "dtype": DT_NAMES.get(str(spec.dtype), str(spec.dtype)),
            "tensor_shape": {"dim": dims, "unknown_rank": False},
            "name": spec.name,
        }

    serving_default = {
        "inputs": {spec.name: tensor(spec) for spec in model.inputs},
        "outputs": {f"output_{i}": tensor(spec) for i, spec in enumerate(model.outputs)},
        "method_name": "tensorflow/serving/predict",
    }
    return {
        "model_spec": {"name": name, "signature_name": "", "version": "1"},
        "metadata": {"signature_def": {"signature_def": {"serving_default": serving_default}}},
        "tfrecipe": signature,
    }


def main(args: list[str]) -> None:
    options = parse(args)
    from tfrecipe.cli import predict, serve_app, serve_rest
    from tfrecipe.runs import RunDir

    # the run dir's files through the one reader, nothing loaded yet
    run = RunDir.at(options.run_dir).trained_model(options.model, command="serve")
    sock = bind(options.host, options.port)
    from tfrecipe.cli.console import discover_devices

    discover_devices()  # TensorFlow only now, with everything checked
    model = run.load(command="serve")
    normalize = predict.normalizer(run.signature)
    from tfrecipe import graph

    # One graph for every batch size (predict_on_batch traces each new size again: 9 ms a row)
    call = graph.function(lambda x: model(x, training=False), reduce_retracing=True)

    def outputs(features) -> np.ndarray:
        return np.asarray(call(predict.model_inputs(features, normalize)))

    served = serve_app.Served(
        name=options.name,
        reading=serve_rest.Reading.of(run.signature, run.dataset),
        predict=outputs,
        decode=lambda values: predict.predictions(run.signature, values),
        metadata=metadata(options.name, model, run.signature),
        max_body=options.max_body,
    )
    _serve(serve_app.build(served), sock, options, run.signature)


def _serve(app, sock: socket.socket, options: Options, signature: dict[str, Any]) -> None:
    """Runs `app` on `sock` until SIGTERM or Ctrl-C (in-flight requests get up to 1 s); the
    start-up lines give its URL and a request of one example (`try_line`) to try."""
    import uvicorn

    stops: list[str] = []

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            stops.append(signal.Signals(sig).name)
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):  # uvicorn's, without raising the signal again at the end
            handled = (signal.SIGINT, signal.SIGTERM)
            before = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in before.items():
                    signal.signal(sig, handler)

    config = uvicorn.Config(
        app, log_level="warning", access_log=False, timeout_graceful_shutdown=1, lifespan="on"
    )
    server = Server(config)
    host, port = sock.getsockname()[:2]
    where = f"http://{_url_host(host)}:{port}/v1/models/{options.name}"
    print(f"tfrecipe serve: {options.run_dir} ({options.model} model) at {where}", flush=True)
    if options.host not in LOOPBACK:
        print(
            f"tfrecipe serve: listening on {options.host}, as --host asked: other machines can "
            "send it requests (no authentication, no TLS)",
            flush=True,
        )
    print(f"tfrecipe serve: try  {try_line(where, signature)}", flush=True)
    server.run(sockets=[sock])
    print(f"tfrecipe serve: stopped ({', '.join(stops) or 'shut down'})", file=sys.stderr)


def try_line(url: str, signature: dict[str, Any]) -> str:
    """`curl` posting one example to the model at `url`, for a shell: built from words, each
    quoted (`printed.shell_word`), as the example's column names are the run dir's
    signature.json's, text someone else may have written."""
    from tfrecipe.printed import shell_word

    example = json.dumps(example_request(signature), separators=(",", ":"))
    return " ".join(shell_word(word) for word in ["curl", "-s", f"{url}:predict", "-d", example])


def example_request(signature: dict[str, Any]) -> dict[str, Any]:
    """A request of one example the run's model takes (zeros, empty strings): the curl line."""
    inputs = signature["inputs"]
    if inputs["kind"] == "columns":
        cells = {"string": ""}
        return {"instances": [{n: cells.get(t, 0) for n, t in inputs["columns"].items()}]}
    if inputs["kind"] == "text":
        return {"instances": ["a text"]}
    example: Any = 0
    for size in reversed(inputs["shape"]):
        example = [example] * size
    return {"instances": [example]}


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
