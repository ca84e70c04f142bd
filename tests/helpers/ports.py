"""Ports for the processes a test starts as a cluster's tasks."""

from __future__ import annotations

import socket


def free_port_pair() -> int:
    """A free port whose next one is free too, both on every interface: a cluster's two tasks
    listen on PORT and PORT + 1, and TensorFlow's gRPC server binds every interface whatever
    host its address names (a lone free port's neighbour, or a port free on 127.0.0.1 alone,
    was once taken: "Could not start gRPC server"). The sbatch jobs' PORT_BASE, the
    Kubernetes pods' TFRECIPE_K8S_PORT."""
    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("0.0.0.0", 0))
            base = first.getsockname()[1]
            try:
                second.bind(("0.0.0.0", base + 1))
            except OSError:
                continue
            return base
    raise RuntimeError("no two free ports in a row")
