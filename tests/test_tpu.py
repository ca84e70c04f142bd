"""`strategy=tpu` on a machine without a TPU: it stops at once with exit code 2 and one clear
line, leaving no run directory (a TPU VM runs the same code for real)."""

from __future__ import annotations

import pytest

from tfrecipe.distribute.launcher import free_ports


@pytest.mark.slow
@pytest.mark.parametrize("tpu", ["local", "grpc://127.0.0.1:{port}"], ids=["local", "grpc"])
def test_without_a_tpu_the_run_stops_with_a_clear_error(cli, tmp_path, tpu):
    tpu = tpu.format(port=free_ports(1)[0])  # nothing listens there
    run_dir = tmp_path / "run"
    result = cli("strategy=tpu", f"strategy.tpu={tpu}", f"hydra.run.dir={run_dir}", timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    report = [line for line in result.stderr.splitlines() if line.startswith("tfrecipe:")]
    assert len(report) == 1, result.stderr[-3000:]
    assert f"strategy=tpu: no TPU reachable at strategy.tpu='{tpu}'" in report[0]
    assert not run_dir.exists()
